-- The outbox sender's queries. They run against Student's database, the
-- only database the sender touches.

-- name: ClaimDue :many
-- Claims up to @batch_size due rows for delivery. SKIP LOCKED lets several
-- senders claim side by side without waiting on each other or taking the
-- same row. The claim is a lease: available_at moves forward by @lease, so
-- if this sender dies mid-delivery the row becomes due again and another
-- sender takes it. The lease token fences the sender's later writes: only
-- the holder of the current token may reschedule or dead-letter the row.
-- A published row whose answer has not come by its available_at is due
-- too (SENDER_TRANSPORT=nats): claimed, it is pending again, and published
-- once more under the same key.
UPDATE outbox o
SET state        = 'pending',
    available_at = now() + @lease::interval,
    lease_token  = gen_random_uuid(),
    claimed_by   = @claimed_by,
    attempts     = o.attempts + 1
FROM (
    SELECT id FROM outbox
    WHERE state IN ('pending', 'published') AND available_at <= now()
    ORDER BY available_at, id
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
) due
WHERE o.id = due.id
RETURNING o.id, o.idempotency_key, o.operation, o.student_id, o.payload, o.attempts,
          o.lease_token::uuid AS lease_token, o.created_at, o.trace_parent,
          -- Judged by the database's clock, which wrote age_from (the
          -- row's creation, or its last redrive).
          (o.age_from + @max_age::interval < now())::boolean AS expired,
          (o.age_from + @max_age::interval)::timestamptz AS expires_at,
          -- The broker transport's last publish of the row, if any: where
          -- its command sits in the stream, and how long ago the broker
          -- took it (SENDER_TRANSPORT=nats).
          COALESCE(o.published_seq, 0)::bigint AS published_seq,
          (now() - COALESCE(o.published_at, now()))::interval AS published_ago;

-- name: LinkStudents :many
-- Records each returned user id on its student unless the student is
-- already linked to a different user, and marks the outbox rows of the
-- students it linked delivered: one statement, so one round trip, for the
-- whole of a delivery's bookkeeping. The student ids that come back were
-- linked (or already held that same user); the caller treats the rest as
-- conflicts. marked says whether this statement settled the student's row:
-- false when it was delivered already (by another sender whose lease this
-- one outlived), so that each settlement is counted once.
--
-- Marking takes no lease check: any answer for this key is the answer, even
-- from a sender whose lease ran out, because Users replays the same result
-- for the key. A user id from Users is the truth, so it also wins over a
-- dead-letter written meanwhile by another sender (for age, say): the user
-- exists.
WITH answers AS (
    SELECT unnest(@outbox_ids::bigint[]) AS outbox_id, unnest(@student_ids::uuid[]) AS student_id,
           unnest(@user_ids::uuid[]) AS user_id
), linked AS (
    UPDATE students s
    SET user_id = a.user_id, updated_at = now()
    FROM answers a
    WHERE s.id = a.student_id AND (s.user_id IS NULL OR s.user_id = a.user_id)
    RETURNING s.id
), delivered AS (
    UPDATE outbox o
    SET state = 'delivered', delivered_at = now(), dead_at = NULL, lease_token = NULL, last_error = NULL,
        reason_class = NULL
    FROM answers a JOIN linked l ON l.id = a.student_id
    WHERE o.id = a.outbox_id AND o.state <> 'delivered'
    RETURNING o.id
)
SELECT l.id AS student_id,
       EXISTS (SELECT 1 FROM delivered d JOIN answers a ON a.outbox_id = d.id WHERE a.student_id = l.id)::boolean AS marked
FROM linked l;

-- name: ScheduleRetries :many
-- Only the holder of the current lease may reschedule a row; a sender whose
-- lease expired and was taken over leaves the row to its new owner. A row
-- never sleeps past its max age: it is claimed then, and dead-lettered.
UPDATE outbox o
SET available_at = LEAST(now() + d.delay, o.age_from + @max_age::interval),
    last_error = d.error, reason_class = d.reason_class, lease_token = NULL
FROM (SELECT unnest(@ids::bigint[]) AS id, unnest(@lease_tokens::uuid[]) AS lease_token,
             unnest(@delays::interval[]) AS delay, unnest(@errors::text[]) AS error,
             unnest(@reason_classes::text[]) AS reason_class) d
WHERE o.id = d.id AND o.lease_token = d.lease_token AND o.state = 'pending'
RETURNING o.id;

-- name: MarkDead :many
-- The nil UUID as lease token skips the fence (claims never hand it out):
-- used for rows whose Users answer
-- cannot be recorded (the student is linked to a different user), which,
-- like a delivery, is a fact about the key rather than about a lease.
UPDATE outbox o
SET state = 'dead', dead_at = now(), last_error = d.error, reason_class = d.reason_class, lease_token = NULL
FROM (SELECT unnest(@ids::bigint[]) AS id, unnest(@lease_tokens::uuid[]) AS lease_token,
             unnest(@errors::text[]) AS error, unnest(@reason_classes::text[]) AS reason_class) d
WHERE o.id = d.id AND o.state = 'pending'
  AND (d.lease_token = '00000000-0000-0000-0000-000000000000' OR o.lease_token = d.lease_token)
RETURNING o.id;

-- name: Release :execrows
-- Hands claimed but unsent rows back at shutdown: due now, and the claim
-- does not count as an attempt.
UPDATE outbox o
SET available_at = now(), lease_token = NULL, claimed_by = NULL, attempts = GREATEST(o.attempts - 1, 0)
FROM (SELECT unnest(@ids::bigint[]) AS id, unnest(@lease_tokens::uuid[]) AS lease_token) d
WHERE o.id = d.id AND o.lease_token = d.lease_token AND o.state = 'pending';

-- name: OutboxStats :one
-- For /metrics: how much work waits, and how long the oldest has waited,
-- pending (not yet handed over) and published (the broker holds the
-- command, Users has not answered).
-- The partial index keeps the pending side cheap; the totals are a full
-- count, fine at scrape intervals for a reference system.
SELECT count(*) FILTER (WHERE state = 'pending')   AS pending,
       count(*) FILTER (WHERE state = 'published') AS published,
       count(*) FILTER (WHERE state = 'delivered') AS delivered,
       count(*) FILTER (WHERE state = 'dead')      AS dead,
       COALESCE(EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE state = 'pending')), 0)::float8
           AS oldest_pending_seconds,
       COALESCE(EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE state = 'published')), 0)::float8
           AS oldest_published_seconds
FROM outbox;

-- name: RecordEvents :exec
-- Adds events of one kind ('attempt' from the recording transaction,
-- 'redrive' from a redrive) in one statement for a whole batch, in the
-- transaction that changed the rows, so the history never disagrees with
-- them. It also keeps each history bounded, however long a row is retried
-- or redriven: the DELETE sees the events from before this statement, so
-- keeping the newest @keep - 1 of them leaves @keep with the new one.
WITH trimmed AS (
    DELETE FROM outbox_events old
    USING (
        SELECT id FROM (
            SELECT id, row_number() OVER (PARTITION BY outbox_id ORDER BY id DESC) AS n
            FROM outbox_events WHERE outbox_id = ANY(@outbox_ids::bigint[])
        ) ranked
        WHERE ranked.n >= @keep::integer
    ) beyond
    WHERE old.id = beyond.id
)
INSERT INTO outbox_events (outbox_id, kind, attempt, outcome, reason_class, error, actor, idempotency_key)
SELECT e.outbox_id, @kind, e.attempt, e.outcome, NULLIF(e.reason_class, ''), NULLIF(e.error, ''), @actor, e.idempotency_key
FROM (SELECT unnest(@outbox_ids::bigint[]) AS outbox_id, unnest(@attempts::integer[]) AS attempt,
             unnest(@outcomes::text[]) AS outcome, unnest(@reason_classes::text[]) AS reason_class,
             unnest(@errors::text[]) AS error, unnest(@idempotency_keys::uuid[]) AS idempotency_key) e;

-- name: PurgeDelivered :execrows
-- Deletes at most batch_size delivered rows older than the retention (and
-- their history, by cascade). Dead rows are never purged: a person must
-- look at them. SKIP LOCKED lets several senders purge side by side.
DELETE FROM outbox
WHERE id IN (
    SELECT old.id FROM outbox old
    WHERE old.state = 'delivered' AND old.delivered_at < now() - @retention::interval
    ORDER BY old.delivered_at
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
);
