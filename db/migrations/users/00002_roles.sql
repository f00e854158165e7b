-- +goose Up
-- Who may do what in Users' database. The roles are created by the migrate
-- step before this file runs (db/migrations/roles.go: roles belong to the
-- whole cluster, so only an administrator can create them), and these
-- migrations run as users_owner, which owns every table and cannot log in.
-- users_app, Users at run time, gets the least its queries (db/queries)
-- need. The outbox sender has no role here: it cannot even connect.
--
-- A column-level grant does not extend to columns added later: a migration
-- that adds a column users_app writes must grant it there.

-- Users creates and reads users; disabling one is an operator's job.
GRANT SELECT, INSERT ON users TO users_app;
-- Idempotency keys: claimed, answered, replayed, purged. A key's request is
-- never rewritten.
GRANT SELECT, INSERT, DELETE ON inbox TO users_app;
GRANT UPDATE (status_code, response_body, resource_id, replays) ON inbox TO users_app;

-- +goose Down
REVOKE ALL ON users, inbox FROM users_app;
