-- +goose Up
-- What an operator needs to act on dead letters: why each attempt failed,
-- a bounded history of attempts, and a way to start an operation again.

-- A short, stable name for why the last attempt failed or why the row is
-- dead (users-unreachable, refused, expired, ...): what operators filter
-- and alert on, while last_error keeps the full message.
ALTER TABLE outbox ADD COLUMN reason_class text;

-- SENDER_MAX_AGE counts from here. A redrive restarts it, so a row that
-- died of old age does not die again on its first claim.
ALTER TABLE outbox ADD COLUMN age_from timestamptz;
UPDATE outbox SET age_from = created_at;
ALTER TABLE outbox ALTER COLUMN age_from SET DEFAULT now(), ALTER COLUMN age_from SET NOT NULL;

-- Keys of earlier operations for this row, oldest first. A redrive in
-- new-operation mode mints a new key; the old key's answer stays in Users'
-- inbox and is listed here.
ALTER TABLE outbox ADD COLUMN previous_keys uuid[] NOT NULL DEFAULT '{}';
ALTER TABLE outbox ADD COLUMN redrives integer NOT NULL DEFAULT 0 CHECK (redrives >= 0);
ALTER TABLE outbox ADD COLUMN redriven_at timestamptz;

-- When the row reached its state: for GET /outbox, which lists each state
-- newest first, by this index.
ALTER TABLE outbox ADD COLUMN state_at timestamptz
    GENERATED ALWAYS AS (COALESCE(dead_at, delivered_at, created_at)) STORED;
CREATE INDEX outbox_state_at_idx ON outbox (state, state_at DESC, id DESC);
-- The retention purge deletes the oldest delivered rows first.
CREATE INDEX outbox_delivered_idx ON outbox (delivered_at) WHERE state = 'delivered';

-- The history of each row: every attempt (its verdict and why) and every
-- redrive, the last few per row (the sender trims older ones), so a row
-- retried for days keeps a short, readable story.
CREATE TABLE outbox_events (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    outbox_id       bigint      NOT NULL REFERENCES outbox (id) ON DELETE CASCADE,
    at              timestamptz NOT NULL DEFAULT now(),
    -- attempt: a delivery's verdict (delivered, retry, dead);
    -- redrive: an operator's redrive (retry or new-operation).
    kind            text        NOT NULL CHECK (kind IN ('attempt', 'redrive')),
    attempt         integer     NOT NULL,
    outcome         text        NOT NULL,
    reason_class    text,
    error           text,
    -- The sender (SENDER_ID) that made the attempt, or who redrove.
    actor           text        NOT NULL,
    -- The key the attempt was sent with (a redrive in new-operation mode
    -- records the new one).
    idempotency_key uuid        NOT NULL
);

CREATE INDEX outbox_events_outbox_idx ON outbox_events (outbox_id, id);

-- +goose Down
DROP TABLE outbox_events;
DROP INDEX outbox_delivered_idx;
DROP INDEX outbox_state_at_idx;
ALTER TABLE outbox DROP COLUMN state_at, DROP COLUMN redriven_at, DROP COLUMN redrives, DROP COLUMN previous_keys,
    DROP COLUMN age_from, DROP COLUMN reason_class;
