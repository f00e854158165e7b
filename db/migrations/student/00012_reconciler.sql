-- +goose Up
-- The reconciler (reconciler/) checks, page by page, that every student
-- ends with exactly one user. Its role, reconciler, reads only the columns
-- that judgement needs: of a student, no name or email; of an outbox row,
-- no payload, no trace context and no last_error (which names hosts), only
-- the reason class. It changes nothing, and its sessions are read-only by
-- default (db/migrations/roles.go). A row dead-lettered before reason
-- classes existed (00002) has none, and the reconciler, which cannot read
-- its message, counts it as dead without a reason: redrive it, or set its
-- reason_class by hand.
--
-- created_at lets it age a stuck student and page over the new ones
-- (students_created_at_id_idx); state_at and dead_at page over the rows
-- delivered or dead-lettered since its last pass (outbox_state_at_idx).
GRANT SELECT (id, document_number, user_id, created_at) ON students TO reconciler;
GRANT SELECT (id, student_id, operation, idempotency_key, state, reason_class, created_at, dead_at, state_at)
    ON outbox TO reconciler;

-- +goose Down
REVOKE ALL ON students, outbox FROM reconciler;
