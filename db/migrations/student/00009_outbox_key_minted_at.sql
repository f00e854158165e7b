-- +goose Up
-- When the row's current idempotency key was minted: the row's creation,
-- or the new-operation redrive that replaced the key. Users forgets a key
-- USERS_INBOX_RETENTION after it first sees it, so a retry redrive (which
-- sends the same key again, for another SENDER_MAX_AGE) is safe only while
-- the key is young enough for Users to remember it until then: past that,
-- a key that created a user before would create a second one. Rows from
-- before this column take their creation time, which is never later than
-- their key's minting, so the check errs on the side of refusing.
ALTER TABLE outbox ADD COLUMN key_minted_at timestamptz;
UPDATE outbox SET key_minted_at = created_at;
ALTER TABLE outbox ALTER COLUMN key_minted_at SET NOT NULL, ALTER COLUMN key_minted_at SET DEFAULT now();
GRANT UPDATE (key_minted_at) ON outbox TO outbox_sender;

-- +goose Down
ALTER TABLE outbox DROP COLUMN key_minted_at;
