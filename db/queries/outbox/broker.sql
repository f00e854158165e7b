-- The broker transport's queries (SENDER_TRANSPORT=nats): a publish the
-- broker acknowledged, and Users' answers read from the reply stream.

-- name: LockRowsForRecord :many
-- Locks the rows of a recording in id order, as a batch of replies locks
-- them (LockRowsForReplies). With the broker, a reply often overtakes the
-- recording of its publish, or of a failed publish the broker took after
-- all; the two then wait for each other rather than deadlock, which each
-- statement's own plan, locking rows in the order it scans them, allowed.
SELECT id FROM outbox WHERE id = ANY(@ids::bigint[]) ORDER BY id FOR UPDATE;

-- name: RecordPublished :many
-- The broker holds these rows' commands: each waits as published for
-- Users' answer, and is due again (published once more, same key) after
-- its wait, never past its max age. Only the lease holder records it, and
-- only on a row still pending: an answer applied meanwhile (a reply can
-- overtake the recording of its own publish) wins.
-- An unread row was not published again: the command the broker took
-- before is still unread by Users, so the row keeps that publish (its
-- time and sequence), the claim does not count as an attempt, and no event
-- is told. A publish gets its attempt's event in the same statement, and
-- counts in publishes, whose count names the next publish's message id.
-- A repeat is a publish the broker already held under its message id
-- (one whose recording was lost): recorded, not counted as an attempt.
WITH d AS (
    SELECT unnest(@ids::bigint[]) AS id, unnest(@lease_tokens::uuid[]) AS lease_token,
           unnest(@seqs::bigint[]) AS seq, unnest(@waits::interval[]) AS wait,
           unnest(@unread::boolean[]) AS unread, unnest(@repeats::boolean[]) AS repeat
), applied AS (
    UPDATE outbox o
    SET state = 'published',
        published_at = CASE WHEN d.unread THEN o.published_at ELSE now() END,
        published_seq = CASE WHEN d.unread THEN o.published_seq ELSE d.seq END,
        publishes = CASE WHEN d.unread THEN o.publishes ELSE o.publishes + 1 END,
        attempts = CASE WHEN d.unread OR d.repeat THEN GREATEST(o.attempts - 1, 0) ELSE o.attempts END,
        available_at = LEAST(now() + d.wait, o.age_from + @max_age::interval),
        lease_token = NULL, last_error = NULL, reason_class = NULL
    FROM d
    WHERE o.id = d.id AND o.lease_token = d.lease_token AND o.state = 'pending'
    RETURNING o.id, o.attempts, o.idempotency_key, d.unread
), events AS (
    INSERT INTO outbox_events (outbox_id, kind, attempt, outcome, actor, idempotency_key)
    SELECT id, 'attempt', attempts, 'published', @actor, idempotency_key
    FROM applied WHERE NOT unread
)
SELECT id FROM applied;

-- name: LockRowsForReplies :many
-- The rows a batch of answers is for, locked for the batch's transaction,
-- each with its student's current link. In id order, as every batch
-- locks them, so that two batches wait for each other rather than
-- deadlock.
SELECT o.id, o.idempotency_key, o.student_id, o.state, o.attempts, o.created_at, s.user_id AS student_user_id
FROM outbox o
JOIN students s ON s.id = o.student_id
WHERE o.idempotency_key = ANY(@idempotency_keys::uuid[])
ORDER BY o.id
FOR UPDATE OF o;

-- name: RepliesReceived :many
-- Which of these replies the sender's inbox holds already: the broker
-- delivered them again, and they were applied.
SELECT message_id FROM reply_inbox WHERE message_id = ANY(@message_ids::uuid[]);

-- name: ReceiveReplies :many
-- Enters replies into the sender's inbox, each with what it did. A reply
-- that does not come back was entered by another transaction meanwhile.
INSERT INTO reply_inbox (message_id, idempotency_key, outbox_id, outcome)
SELECT d.message_id, d.idempotency_key, NULLIF(d.outbox_id, 0), d.outcome
FROM (SELECT unnest(@message_ids::uuid[]) AS message_id, unnest(@idempotency_keys::uuid[]) AS idempotency_key,
             unnest(@outbox_ids::bigint[]) AS outbox_id, unnest(@outcomes::text[]) AS outcome) d
ON CONFLICT (message_id) DO NOTHING
RETURNING message_id;

-- name: MarkDeadByReplies :exec
-- Users refused these operations, or their users cannot be linked (the
-- students have others): the rows are dead whatever lease they are
-- under. One statement for a batch of replies, sent with its COMMIT.
UPDATE outbox o
SET state = 'dead', dead_at = now(), last_error = d.error, reason_class = d.reason_class, lease_token = NULL
FROM (
    SELECT unnest(@ids::bigint[]) AS id, unnest(@reason_classes::text[]) AS reason_class,
           unnest(@errors::text[]) AS error
) d
WHERE o.id = d.id AND o.state IN ('pending', 'published');

-- name: PurgeReplies :execrows
-- Forgets replies received before the retention. No FOR UPDATE: that
-- takes the UPDATE privilege, which the sender's role has no need of on
-- this table; two purges at once only wait for each other.
DELETE FROM reply_inbox
WHERE message_id IN (
    SELECT message_id FROM reply_inbox
    WHERE received_at < now() - @retention::interval
    ORDER BY received_at
    LIMIT @batch_size
);

-- name: ParkReply :exec
-- Keeps a reply the sender could not read, for an operator.
INSERT INTO parked_replies (stream, stream_sequence, subject, headers, data, size, reason, deliveries)
VALUES (@stream, @stream_sequence, @subject, @headers, @data, @size, @reason, @deliveries)
ON CONFLICT (stream, stream_sequence) DO NOTHING;

-- name: PurgeParkedReplies :execrows
-- Forgets parked replies older than the retention, oldest first, as
-- PurgeReplies does the inbox of replies.
DELETE FROM parked_replies
WHERE (stream, stream_sequence) IN (
    SELECT stream, stream_sequence FROM parked_replies
    WHERE parked_at < now() - @retention::interval
    ORDER BY parked_at
    LIMIT @batch_size
);
