-- +goose Up
-- A parked command keeps its headers and the first few KiB of its data
-- (natsbus.ParkedKeep), with its full size, instead of up to the broker's
-- 1 MB per message; and it is kept for USERS_PARKED_RETENTION, then
-- purged by Users, as old inbox rows are. An operator reads and empties
-- the table as docs/runbook.md says.
ALTER TABLE parked_commands ADD COLUMN size integer;
UPDATE parked_commands SET size = length(data);
ALTER TABLE parked_commands ALTER COLUMN size SET NOT NULL;
UPDATE parked_commands SET data = substring(data FROM 1 FOR 4096) WHERE length(data) > 4096;
CREATE INDEX parked_commands_parked_at_idx ON parked_commands (parked_at);
GRANT DELETE ON parked_commands TO users_app;
GRANT SELECT (size) ON parked_commands TO lab_reader;

-- +goose Down
REVOKE DELETE ON parked_commands FROM users_app;
DROP INDEX parked_commands_parked_at_idx;
ALTER TABLE parked_commands DROP COLUMN size;
