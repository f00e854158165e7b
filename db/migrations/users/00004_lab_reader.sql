-- +goose Up
-- The fault lab's reader (see student/00007_lab_reader.sql): the columns
-- the invariant checker reads, and nothing else. Of a user, no name or
-- email; of an inbox row, no request or stored answer. The caller tells the
-- sender's keys from those of other callers (an operator with curl).
GRANT SELECT (id, document_number, enabled) ON users TO lab_reader;
GRANT SELECT (caller, idempotency_key, status_code, resource_id, replays) ON inbox TO lab_reader;

-- +goose Down
REVOKE ALL ON users, inbox FROM lab_reader;
