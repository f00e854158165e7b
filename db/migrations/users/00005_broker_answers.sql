-- +goose Up
-- The broker transport (SENDER_TRANSPORT=nats): Users reads create-user
-- commands from a stream and answers through an outbox of its own. The
-- answer row is written in the transaction that creates the user and
-- stores the key's answer in the inbox, so that no user exists whose
-- answer could be lost; a relay publishes it to the reply stream later.
CREATE TABLE answers (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The reply's Nats-Msg-Id: JetStream drops a republish of the same row
    -- within its de-duplication window.
    message_id      uuid        NOT NULL UNIQUE,
    -- The key of the command answered, also the reply's Idempotency-Key.
    idempotency_key uuid        NOT NULL,
    subject         text        NOT NULL,
    -- The reply's body (natsbus.Reply): the key, the status and its body,
    -- as the HTTP hop would have answered. json, not jsonb: json keeps the
    -- text as written, so the reply's body is the HTTP answer's, byte for
    -- byte.
    payload         json        NOT NULL,
    -- The command's trace context, so that the reply joins its trace.
    trace_parent    text        NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- Null until the relay's publish was acknowledged.
    published_at    timestamptz
);

-- The relay claims the oldest unpublished answers; published ones are
-- most of the table and none of the relay's business.
CREATE INDEX answers_unpublished_idx ON answers (id) WHERE published_at IS NULL;
-- The retention purge deletes the oldest published answers first.
CREATE INDEX answers_published_at_idx ON answers (published_at) WHERE published_at IS NOT NULL;

-- Commands Users could not read (no key, not JSON) after
-- USERS_COMMAND_MAX_DELIVERIES deliveries: kept, as received, for an
-- operator, and terminated on the stream so they block nothing behind them.
CREATE TABLE parked_commands (
    stream          text        NOT NULL,
    -- The command's sequence in its stream: parking it twice (the first
    -- Term lost) keeps one row.
    stream_sequence bigint      NOT NULL,
    subject         text        NOT NULL,
    headers         jsonb       NOT NULL,
    data            bytea       NOT NULL,
    reason          text        NOT NULL,
    deliveries      integer     NOT NULL,
    parked_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream, stream_sequence)
);

-- Users writes answers and marks them published; the purge deletes old
-- published ones. Identity columns need no grant on their sequence.
GRANT SELECT, INSERT, DELETE ON answers TO users_app;
GRANT UPDATE (published_at) ON answers TO users_app;
-- Parked commands are written once and left to the operator.
GRANT SELECT, INSERT ON parked_commands TO users_app;

-- The fault lab's reader: what was answered and relayed, and what was
-- parked, but no payload, headers or data.
GRANT SELECT (id, message_id, idempotency_key, subject, created_at, published_at) ON answers TO lab_reader;
GRANT SELECT (stream, stream_sequence, subject, reason, deliveries, parked_at) ON parked_commands TO lab_reader;

-- +goose Down
DROP TABLE parked_commands;
DROP TABLE answers;
