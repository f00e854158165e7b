-- +goose Up
-- The broker transport (SENDER_TRANSPORT=nats). Publishing a row's command
-- is not delivering it: the broker has it, Users has not answered yet. The
-- row waits as 'published' until Users' answer comes back on the reply
-- stream, and is due again (published once more, under the same key) if
-- none comes by available_at. Its max age, dead letters and redrives work
-- as for a pending row.
ALTER TABLE outbox DROP CONSTRAINT outbox_state_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_state_check
    CHECK (state IN ('pending', 'published', 'delivered', 'dead'));
-- The broker's acknowledgement of the last publish: when, and the command's
-- sequence in its stream (what an operator looks up on the broker).
ALTER TABLE outbox ADD COLUMN published_at timestamptz, ADD COLUMN published_seq bigint;
-- The claim takes due rows in either state.
DROP INDEX outbox_due_idx;
CREATE INDEX outbox_due_idx ON outbox (available_at, id) WHERE state IN ('pending', 'published');

-- A reply applied to a row is history too.
ALTER TABLE outbox_events DROP CONSTRAINT outbox_events_kind_check;
ALTER TABLE outbox_events ADD CONSTRAINT outbox_events_kind_check CHECK (kind IN ('attempt', 'redrive', 'reply'));

-- The sender's inbox for Users' answers: one row per reply message (its
-- Nats-Msg-Id, which Users minted with the answer). The broker delivers a
-- reply at least once; a repeat finds its row here and changes nothing.
CREATE TABLE reply_inbox (
    message_id      uuid        PRIMARY KEY,
    idempotency_key uuid        NOT NULL,
    -- The row the reply was for; NULL when no row had that key any more
    -- (purged, or redriven under a new key).
    outbox_id       bigint,
    -- What the reply did: linked, refused, conflict, already-settled, unmatched.
    outcome         text        NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX reply_inbox_received_idx ON reply_inbox (received_at);

GRANT UPDATE (published_at, published_seq) ON outbox TO outbox_sender;
GRANT SELECT, INSERT, DELETE ON reply_inbox TO outbox_sender;

-- +goose Down
DROP TABLE reply_inbox;
DELETE FROM outbox_events WHERE kind = 'reply';
ALTER TABLE outbox_events DROP CONSTRAINT outbox_events_kind_check;
ALTER TABLE outbox_events ADD CONSTRAINT outbox_events_kind_check CHECK (kind IN ('attempt', 'redrive'));
DROP INDEX outbox_due_idx;
-- A published row goes back to pending: its command may be in the broker,
-- and the HTTP hop sends the same key, which Users' inbox answers once.
UPDATE outbox SET state = 'pending' WHERE state = 'published';
CREATE INDEX outbox_due_idx ON outbox (available_at, id) WHERE state = 'pending';
ALTER TABLE outbox DROP COLUMN published_at, DROP COLUMN published_seq;
ALTER TABLE outbox DROP CONSTRAINT outbox_state_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_state_check CHECK (state IN ('pending', 'delivered', 'dead'));
