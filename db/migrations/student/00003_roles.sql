-- +goose Up
-- Who may do what in Student's database. The roles are created by the
-- migrate step before this file runs (db/migrations/roles.go: roles belong
-- to the whole cluster, so only an administrator can create them), and
-- these migrations run as student_owner, which owns every table and cannot
-- log in. Each runtime role gets the least its queries (db/queries) need:
--
--   student_app    Student: creates students with their outbox row, reads
--                  them with their provisioning state, keeps client keys.
--   outbox_sender  the sender: claims, records and redrives outbox rows,
--                  links students to their users, purges delivered rows.
--
-- An UPDATE or DELETE with a WHERE needs SELECT on the columns it reads. A
-- column-level grant does not extend to columns added later: a migration
-- that adds a column a runtime role writes must grant it there. Identity
-- columns need no grant on their sequence.

-- Student never changes a student once created: linking it to its user is
-- the sender's job.
GRANT SELECT, INSERT ON students TO student_app;
-- The outbox row, written with the student; the sender does the rest.
GRANT INSERT (idempotency_key, operation, student_id, payload) ON outbox TO student_app;
-- The provisioning state GET /students shows; never last_error or the
-- payload, which are for operators.
GRANT SELECT (student_id, operation, state, attempts, reason_class, redrives, redriven_at) ON outbox TO student_app;
-- Client idempotency keys: claimed, answered, replayed, purged. A key's
-- request is never rewritten.
GRANT SELECT, INSERT, DELETE ON inbox TO student_app;
GRANT UPDATE (status_code, response_body, resource_id, replays) ON inbox TO student_app;

-- The sender sees of a student only what linking and the admin API need,
-- and may change only the link: no name, email or document number.
GRANT SELECT (id, name, user_id) ON students TO outbox_sender;
GRANT UPDATE (user_id, updated_at) ON students TO outbox_sender;
-- Every outbox column is the sender's to read (claims, the admin API);
-- it writes the delivery state, never what the operation is (operation,
-- student_id, payload, created_at), and inserts no rows. DELETE is the
-- purge of delivered rows.
GRANT SELECT, DELETE ON outbox TO outbox_sender;
GRANT UPDATE (state, attempts, available_at, lease_token, claimed_by, last_error, reason_class,
              delivered_at, dead_at, age_from, redrives, redriven_at, idempotency_key, previous_keys)
    ON outbox TO outbox_sender;
-- Each row's history: recorded, read, and trimmed to its newest events.
GRANT SELECT, INSERT, DELETE ON outbox_events TO outbox_sender;

-- +goose Down
REVOKE ALL ON students, outbox, outbox_events, inbox FROM student_app, outbox_sender;
