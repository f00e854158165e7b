-- +goose Up
-- The outbox's inserts, published for the sender's change-data-capture
-- source (SENDER_SOURCE=cdc): it reads them from the write-ahead log
-- through a logical replication slot with pgoutput, PostgreSQL's built-in
-- decoder, instead of polling the table. Only inserts: a new row is all the
-- stream announces; retries, redrives and every later change go through
-- the table and the poll, so the stream never has to be replayed for them.
--
-- A publication is cheap when nobody reads it, and it needs no wal_level:
-- the polling sender ignores it, and the slot (which does need
-- wal_level=logical) is created by the cdc sender itself, the first time it
-- starts (outbox-sender/cdc/session.go, ensureSlot).
CREATE PUBLICATION outbox_inserts FOR TABLE outbox WITH (publish = 'insert');

-- +goose Down
DROP PUBLICATION outbox_inserts;
