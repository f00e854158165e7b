-- +goose Up
-- Idempotency keys are scoped per caller: the same key from two callers is
-- two operations. A key is its client's own name for an operation, and
-- nothing stops two clients from choosing the same one (a counter, a batch
-- id). Without a scope the second caller would get the first one's answer,
-- or a 422 naming the fields in which their requests differ: a way to probe
-- another caller's requests.
--
-- Users' callers authenticate (USERS_API_TOKENS) and each request's caller
-- scopes its key. Rows written before callers existed belong to the empty
-- caller ''. Upgrading a running system: after migrating, and before the
-- sender delivers again, move them to the sender's caller name
-- (UPDATE inbox SET caller = 'outbox-sender' WHERE caller = ''), or a retry
-- of a key answered before the upgrade would run again as a new operation.
ALTER TABLE inbox ADD COLUMN caller text NOT NULL DEFAULT '';
ALTER TABLE inbox DROP CONSTRAINT inbox_pkey;
ALTER TABLE inbox ADD PRIMARY KEY (caller, idempotency_key);

-- +goose Down
-- Fails while two callers hold the same key: which answer to keep is not
-- the migration's to decide.
ALTER TABLE inbox DROP CONSTRAINT inbox_pkey;
ALTER TABLE inbox ADD PRIMARY KEY (idempotency_key);
ALTER TABLE inbox DROP COLUMN caller;
