-- +goose Up
-- The reconciler's reader (see student/00012_reconciler.sql): of a user,
-- no name or email; of an inbox row, no request and no stored answer body,
-- only which user the answer made (resource_id) and when. The caller tells
-- the sender's keys from other callers' (an operator with curl).
GRANT SELECT (id, document_number, enabled, created_at) ON users TO reconciler;
GRANT SELECT (caller, idempotency_key, status_code, resource_id, created_at) ON inbox TO reconciler;

-- +goose Down
REVOKE ALL ON users, inbox FROM reconciler;
