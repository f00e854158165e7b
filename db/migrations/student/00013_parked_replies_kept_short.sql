-- +goose Up
-- A parked reply keeps its headers and the first few KiB of its data
-- (natsbus.ParkedKeep), with its full size, instead of up to the broker's
-- 1 MB per message; and it is kept for SENDER_PARKED_RETENTION, then
-- purged by the sender, as delivered rows are. An operator reads and
-- empties the table as docs/runbook.md says.
ALTER TABLE parked_replies ADD COLUMN size integer;
UPDATE parked_replies SET size = length(data);
ALTER TABLE parked_replies ALTER COLUMN size SET NOT NULL;
UPDATE parked_replies SET data = substring(data FROM 1 FOR 4096) WHERE length(data) > 4096;
CREATE INDEX parked_replies_parked_at_idx ON parked_replies (parked_at);
GRANT DELETE ON parked_replies TO outbox_sender;

-- +goose Down
REVOKE DELETE ON parked_replies FROM outbox_sender;
DROP INDEX parked_replies_parked_at_idx;
ALTER TABLE parked_replies DROP COLUMN size;
