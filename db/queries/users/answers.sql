-- Users' own outbox (the answers to broker commands, relayed to the reply
-- stream) and the commands it parked. See 00005_broker_answers.sql.

-- name: InsertAnswer :exec
-- A message id already present is the same answer written again (a
-- refusal the inbox does not store, redelivered; a replay of a key whose
-- answer row exists): one row, one reply.
INSERT INTO answers (message_id, idempotency_key, subject, payload, trace_parent)
VALUES (@message_id, @idempotency_key, @subject, @payload, @trace_parent)
ON CONFLICT (message_id) DO NOTHING;

-- name: ClaimAnswers :many
-- SKIP LOCKED: several Users processes relay side by side, each its own
-- rows; the lock holds until the relay marks them published or rolls back.
SELECT id, message_id, idempotency_key, subject, payload, trace_parent
FROM answers
WHERE published_at IS NULL
ORDER BY id
LIMIT @batch_size
FOR UPDATE SKIP LOCKED;

-- name: MarkAnswersPublished :exec
UPDATE answers SET published_at = now() WHERE id = ANY(@ids::bigint[]);

-- name: CountUnpublishedAnswers :one
SELECT count(*) FROM answers WHERE published_at IS NULL;

-- name: PurgePublishedAnswers :execrows
-- As the inbox's purge: a bounded batch per statement, by the database's
-- clock. Unpublished answers are never purged, however old.
DELETE FROM answers
WHERE id IN (
    SELECT old.id FROM answers old
    WHERE old.published_at < now() - @retention::interval
    ORDER BY old.published_at
    LIMIT @batch_size
);

-- name: ParkCommand :exec
INSERT INTO parked_commands (stream, stream_sequence, subject, headers, data, size, reason, deliveries)
VALUES (@stream, @stream_sequence, @subject, @headers, @data, @size, @reason, @deliveries)
ON CONFLICT (stream, stream_sequence) DO NOTHING;

-- name: PurgeParkedCommands :execrows
-- Forgets parked commands older than the retention, oldest first. No FOR
-- UPDATE: nothing updates a parked command, and the role has no need of
-- the privilege; two purges at once only wait for each other.
DELETE FROM parked_commands
WHERE (stream, stream_sequence) IN (
    SELECT stream, stream_sequence FROM parked_commands
    WHERE parked_at < now() - @retention::interval
    ORDER BY parked_at
    LIMIT @batch_size
);
