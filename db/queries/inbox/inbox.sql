-- The inbox protocol, shared by Student (client keys on POST /students) and
-- Users (the sender's keys on POST /users). Both databases have the same
-- inbox table. A key lives in its caller's scope, the authenticated
-- caller's name: every statement names both.

-- name: StoreKey :exec
-- The key with the answer its operation gives, stored ahead of the
-- operation's statements in one transaction (Inbox.Do). No ON CONFLICT: a
-- key already stored fails the statement, and with it the transaction, so
-- the operation's statements queued after it never run. A concurrent
-- transaction inserting the same key waits on the primary key until this
-- one ends, then fails if this one committed, or goes on if it rolled back.
INSERT INTO inbox (caller, idempotency_key, request_hash, request, status_code, response_body, resource_id)
VALUES (@caller, @idempotency_key, @request_hash, @request, @status_code, @response_body, @resource_id);

-- name: GetKey :one
SELECT idempotency_key, request_hash, request, status_code, response_body, resource_id, replays, created_at, caller
FROM inbox
WHERE caller = @caller AND idempotency_key = @idempotency_key;

-- name: CountReplay :exec
UPDATE inbox SET replays = replays + 1 WHERE caller = @caller AND idempotency_key = @idempotency_key;

-- name: PurgeOlderThan :execrows
-- Deletes at most batch_size rows per call, so the purge never holds long
-- locks or writes a huge transaction. Age is measured by the database's
-- clock, the one that wrote created_at.
DELETE FROM inbox
WHERE (caller, idempotency_key) IN (
    SELECT old.caller, old.idempotency_key FROM inbox old
    WHERE old.created_at < now() - @retention::interval
    ORDER BY old.created_at
    LIMIT @batch_size
);
