-- +goose Up
-- Replies from Users the sender could not read (SENDER_TRANSPORT=nats),
-- after a few deliveries: kept here for an operator, then terminated on
-- the broker. Left unacknowledged in the stream instead, each would hold
-- one of the reply consumer's pending slots for good, and a rollout that
-- made every reply unreadable would stop the reading of replies.
CREATE TABLE parked_replies (
    stream          text        NOT NULL,
    -- The reply's sequence in its stream: parking it twice (the first
    -- termination lost) keeps one row.
    stream_sequence bigint      NOT NULL,
    subject         text        NOT NULL,
    headers         jsonb       NOT NULL,
    data            bytea       NOT NULL,
    reason          text        NOT NULL,
    deliveries      integer     NOT NULL,
    parked_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream, stream_sequence)
);
GRANT SELECT, INSERT ON parked_replies TO outbox_sender;

-- +goose Down
DROP TABLE parked_replies;
