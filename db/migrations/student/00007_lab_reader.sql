-- +goose Up
-- The fault lab (lab/) shows the invariant checker's verdict live. Its
-- role, lab_reader, reads exactly the columns the checker reads: of a
-- student, no name or email; of an outbox row, no payload. It changes
-- nothing (and its sessions are read-only by default, db/migrations/roles.go).
GRANT SELECT (id, document_number, user_id) ON students TO lab_reader;
GRANT SELECT (student_id, operation, idempotency_key, state, attempts, last_error, claimed_by) ON outbox TO lab_reader;

-- +goose Down
REVOKE ALL ON students, outbox FROM lab_reader;
