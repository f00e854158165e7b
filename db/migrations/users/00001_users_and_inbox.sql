-- +goose Up
-- Users' database: the users it owns and the inbox that remembers what each
-- idempotency key already did. A user and its inbox row are written in one
-- local transaction, so an inbox row never claims a user that does not exist.

CREATE TABLE users (
    id              uuid        PRIMARY KEY,
    name            text        NOT NULL,
    email           text        NOT NULL,
    document_number text        NOT NULL,
    enabled         boolean     NOT NULL DEFAULT true,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- The business rule, separate from the inbox: at most one enabled user per
-- document number. Two different keys are two operations; this index, not
-- the inbox, decides whether the second may create a user.
CREATE UNIQUE INDEX users_one_enabled_per_document ON users (document_number) WHERE enabled;

CREATE TABLE inbox (
    idempotency_key text        PRIMARY KEY,
    -- sha256 of the canonical request; request keeps the canonical fields
    -- so a mismatch can name the fields that differ.
    request_hash    bytea       NOT NULL,
    request         jsonb       NOT NULL,
    -- The outcome stored with the key and served again on every repeat.
    status_code     integer,
    response_body   text,
    -- The user created under this key; null when the outcome was a refusal
    -- (document number taken), which is stored and replayed all the same.
    resource_id     uuid,
    -- How many repeats were answered from this row.
    replays         integer     NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- The retention purge deletes the oldest rows first.
CREATE INDEX inbox_created_at_idx ON inbox (created_at);

-- +goose Down
DROP TABLE inbox;
DROP TABLE users;
