-- +goose Up
-- The W3C traceparent of the request that wrote the row (POST /students),
-- so the sender can continue that trace on every delivery attempt, however
-- long after the request ended: one trace shows an operation's whole life,
-- retries hours apart included. NULL when tracing was off at insert time;
-- the sender then starts a trace of its own. It is written in the same
-- statement as the row, and never changed.
ALTER TABLE outbox ADD COLUMN trace_parent text;

-- Student writes it with the row. Column grants do not extend to columns
-- added later (see 00003_roles.sql); the sender already reads every outbox
-- column through its table-level SELECT.
GRANT INSERT (trace_parent) ON outbox TO student_app;

-- +goose Down
REVOKE INSERT (trace_parent) ON outbox FROM student_app;
ALTER TABLE outbox DROP COLUMN trace_parent;
