-- +goose Up
-- A redrive counts attempts afresh (SENDER_MAX_ATTEMPTS and the backoff
-- start again), so attempts alone forgets what was tried before. This
-- column keeps the sum: attempts_before_redrive + attempts is every attempt
-- the row ever had, which the fault lab and the invariant checker count
-- and the admin API shows.
ALTER TABLE outbox ADD COLUMN attempts_before_redrive integer NOT NULL DEFAULT 0
    CHECK (attempts_before_redrive >= 0);
GRANT UPDATE (attempts_before_redrive) ON outbox TO outbox_sender;
GRANT SELECT (attempts_before_redrive) ON outbox TO lab_reader;

-- +goose Down
ALTER TABLE outbox DROP COLUMN attempts_before_redrive;
