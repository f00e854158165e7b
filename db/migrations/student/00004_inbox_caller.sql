-- +goose Up
-- The inbox table has the same layout in both databases (internal/inbox
-- owns its queries), and Users' keys are now scoped per caller (see
-- users/00003_inbox_caller.sql). Student authenticates no one: its public
-- clients are all the anonymous caller '', one key space, as before.
ALTER TABLE inbox ADD COLUMN caller text NOT NULL DEFAULT '';
ALTER TABLE inbox DROP CONSTRAINT inbox_pkey;
ALTER TABLE inbox ADD PRIMARY KEY (caller, idempotency_key);

-- +goose Down
ALTER TABLE inbox DROP CONSTRAINT inbox_pkey;
ALTER TABLE inbox ADD PRIMARY KEY (idempotency_key);
ALTER TABLE inbox DROP COLUMN caller;
