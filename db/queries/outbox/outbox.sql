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
          COALESCE(o.published_seq, 0)::bigint AS published_seq, o.publishes,
          (now() - COALESCE(o.published_at, now()))::interval AS published_ago;

-- name: LinkStudents :many
-- Records each returned user id on its student unless the student is
-- already linked to a different user, and marks the outbox rows of the
-- students it linked delivered: one statement, so one round trip, for the
-- whole of a delivery's bookkeeping. A row whose student holds a
-- different user is a conflict: it is dead-lettered, with its
-- @conflict_errors entry, while it still waits. It returns a row per
-- answer: linked says whether the student was linked (or already held that
-- same user); settled whether this statement settled the outbox row
-- (delivered or dead-lettered it): false when it was delivered already (by
-- another sender whose lease this one outlived), so that each settlement
-- is counted once.
--
-- Neither the marking nor the dead-letter takes a lease check: any answer
-- for this key is the answer, even from a sender whose lease ran out,
-- because Users replays the same result for the key. A user id from Users
-- is the truth, so it also wins over a dead-letter written meanwhile by
-- another sender (for age, say): the user exists.
WITH answers AS (
    SELECT unnest(@outbox_ids::bigint[]) AS outbox_id, unnest(@student_ids::uuid[]) AS student_id,
           unnest(@user_ids::uuid[]) AS user_id, unnest(@conflict_errors::text[]) AS conflict_error
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
), refused AS MATERIALIZED (
    -- Apart, so that the outbox is looked at only for the answers refused
    -- (rarely any), not for every answer.
    SELECT a.outbox_id, a.conflict_error FROM answers a
    WHERE NOT EXISTS (SELECT 1 FROM linked l WHERE l.id = a.student_id)
), conflicted AS (
    UPDATE outbox o
    SET state = 'dead', dead_at = now(), last_error = r.conflict_error, reason_class = 'conflict',
        lease_token = NULL
    FROM refused r
    WHERE o.id = r.outbox_id AND o.state IN ('pending', 'published')
    RETURNING o.id
)
SELECT a.outbox_id::bigint AS outbox_id,
       EXISTS (SELECT 1 FROM linked l WHERE l.id = a.student_id)::boolean AS linked,
       (EXISTS (SELECT 1 FROM delivered d WHERE d.id = a.outbox_id)
        OR EXISTS (SELECT 1 FROM conflicted c WHERE c.id = a.outbox_id))::boolean AS settled
FROM answers a;

-- name: ScheduleRetries :many
-- Only the holder of the current lease may reschedule a row; a sender whose
-- lease expired and was taken over leaves the row to its new owner. A row
-- never sleeps past its max age: it is claimed then, and dead-lettered.
-- Each row rescheduled gets its attempt's event in the same statement, so
-- that only what was written is told (TrimHistories keeps it short). An
-- unsent attempt (nothing left for Users: the broker's connection down or
-- its login refused) gives back the attempt its claim counted.
WITH d AS (
    SELECT unnest(@ids::bigint[]) AS id, unnest(@lease_tokens::uuid[]) AS lease_token,
           unnest(@delays::interval[]) AS delay, unnest(@errors::text[]) AS error,
           unnest(@reason_classes::text[]) AS reason_class, unnest(@unsent::boolean[]) AS unsent
), applied AS (
    UPDATE outbox o
    SET available_at = LEAST(now() + d.delay, o.age_from + @max_age::interval),
        attempts = CASE WHEN d.unsent THEN GREATEST(o.attempts - 1, 0) ELSE o.attempts END,
        last_error = d.error, reason_class = d.reason_class, lease_token = NULL
    FROM d
    WHERE o.id = d.id AND o.lease_token = d.lease_token AND o.state = 'pending'
    RETURNING o.id, o.attempts, o.idempotency_key, d.error, d.reason_class
), events AS (
    INSERT INTO outbox_events (outbox_id, kind, attempt, outcome, reason_class, error, actor, idempotency_key)
    SELECT id, 'attempt', attempts, 'retry', NULLIF(reason_class, ''), NULLIF(error, ''), @actor, idempotency_key
    FROM applied
)
SELECT id FROM applied;

-- name: MarkDead :many
-- Only the holder of the current lease may dead-letter a row, as with
-- ScheduleRetries, and each row dead-lettered gets its attempt's event in
-- the same statement. (A conflict, which is a fact about the key rather
-- than about a lease, is dead-lettered by LinkStudents.)
WITH d AS (
    SELECT unnest(@ids::bigint[]) AS id, unnest(@lease_tokens::uuid[]) AS lease_token,
           unnest(@errors::text[]) AS error, unnest(@reason_classes::text[]) AS reason_class
), applied AS (
    UPDATE outbox o
    SET state = 'dead', dead_at = now(), last_error = d.error, reason_class = d.reason_class, lease_token = NULL
    FROM d
    WHERE o.id = d.id AND o.state = 'pending' AND o.lease_token = d.lease_token
    RETURNING o.id, o.attempts, o.idempotency_key, d.error, d.reason_class
), events AS (
    INSERT INTO outbox_events (outbox_id, kind, attempt, outcome, reason_class, error, actor, idempotency_key)
    SELECT id, 'attempt', attempts, 'dead', NULLIF(reason_class, ''), NULLIF(error, ''), @actor, idempotency_key
    FROM applied
)
SELECT id FROM applied;

-- name: Release :execrows
-- Hands claimed but unsent rows back at shutdown: due now, and the claim
-- does not count as an attempt.
UPDATE outbox o
SET available_at = now(), lease_token = NULL, claimed_by = NULL, attempts = GREATEST(o.attempts - 1, 0)
FROM (SELECT unnest(@ids::bigint[]) AS id, unnest(@lease_tokens::uuid[]) AS lease_token) d
WHERE o.id = d.id AND o.lease_token = d.lease_token AND o.state = 'pending';

-- name: TrimHistories :exec
-- Keeps the newest @keep events of each row, however long it is retried
-- or redriven. It runs last in the recording's transaction, so it sees the
-- events the statements before it added.
DELETE FROM outbox_events old
USING (
    SELECT id FROM (
        SELECT id, row_number() OVER (PARTITION BY outbox_id ORDER BY id DESC) AS n
        FROM outbox_events WHERE outbox_id = ANY(@outbox_ids::bigint[])
    ) ranked
    WHERE ranked.n > @keep::integer
) beyond
WHERE old.id = beyond.id;

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
--
-- An event of a delivery is written as the delivery turned out, so that
-- it can go out with LinkStudents, before its answer is known: a row that
-- is not delivered by now had its answer refused by LinkStudents earlier
-- in the transaction (the student holds another user), and its event is
-- the conflict, with the error given for that case. A delivery that was
-- recorded has no error.
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
SELECT e.outbox_id, @kind, e.attempt,
       CASE WHEN j.refused THEN 'dead' ELSE e.outcome END,
       CASE WHEN j.refused THEN 'conflict' ELSE NULLIF(e.reason_class, '') END,
       CASE WHEN e.outcome = 'delivered' AND NOT j.refused THEN NULL ELSE NULLIF(e.error, '') END,
       @actor, e.idempotency_key
FROM (SELECT unnest(@outbox_ids::bigint[]) AS outbox_id, unnest(@attempts::integer[]) AS attempt,
             unnest(@outcomes::text[]) AS outcome, unnest(@reason_classes::text[]) AS reason_class,
             unnest(@errors::text[]) AS error, unnest(@idempotency_keys::uuid[]) AS idempotency_key) e
CROSS JOIN LATERAL (
    SELECT e.outcome = 'delivered'
           AND EXISTS (SELECT 1 FROM outbox o WHERE o.id = e.outbox_id AND o.state <> 'delivered') AS refused
    -- OFFSET 0 keeps the planner from copying the lookup into each CASE,
    -- so the row is looked up once.
    OFFSET 0
) j;

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
