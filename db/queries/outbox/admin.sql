-- The operator's queries: dead letters listed, read and redriven through
-- the sender's admin port and its "dead" subcommands.

-- name: ListOutbox :many
-- Newest first by state_at (when the row reached its state), keyset-paged
-- on (state_at, id) along outbox_state_at_idx.
SELECT o.id, o.idempotency_key, o.operation, o.student_id, o.state, o.attempts, o.attempts_before_redrive, o.reason_class,
       o.last_error, o.created_at, o.delivered_at, o.dead_at, o.redrives, o.redriven_at,
       o.state_at::timestamptz AS state_at
FROM outbox o
WHERE o.state = @state
  AND (@reason_class::text = '' OR o.reason_class = @reason_class::text)
  AND o.state_at >= @since::timestamptz
  AND o.state_at < @until::timestamptz
  AND (o.state_at, o.id) < (@before_at::timestamptz, @before_id::bigint)
ORDER BY o.state_at DESC, o.id DESC
LIMIT @page_size;

-- name: GetOutboxRow :one
SELECT o.id, o.idempotency_key, o.previous_keys, o.operation, o.student_id, o.state,
       o.attempts, o.attempts_before_redrive, o.reason_class, o.last_error, o.available_at, o.claimed_by, o.created_at,
       o.age_from, o.delivered_at, o.dead_at, o.redrives, o.redriven_at, o.key_minted_at,
       -- By the database's clock, as Redrive judges it.
       (now() - o.key_minted_at)::interval AS key_age,
       s.name AS student_name, s.user_id AS student_user_id
FROM outbox o
JOIN students s ON s.id = o.student_id
WHERE o.id = @id;

-- name: ListEvents :many
SELECT id, at, kind, attempt, outcome, reason_class, error, actor, idempotency_key
FROM outbox_events
WHERE outbox_id = @outbox_id
ORDER BY id;

-- name: FindDead :one
-- A bulk redrive's walk through the dead rows of a filter, oldest death
-- first: the ids of up to @max_rows rows it takes (with the same rules as
-- Redrive; @new_key_safe is outbox.NewKeySafe), and how many rows it
-- passed by on the way, counted once each under the first reason that
-- holds. The walk ends at the last row taken when it took @max_rows, and
-- takes in every row of the filter otherwise.
--
-- The rows taken are locked FOR UPDATE SKIP LOCKED, as Redrive locks them:
-- in the caller's transaction they stay as they are until it redrives
-- them, and a row another transaction holds is passed by, not waited for.
-- Every part of one statement reads the same snapshot, so a row of the walk
-- that no rule refuses and that was not taken is one SKIP LOCKED passed
-- by: that is the busy count, with no waiting and no second look.
WITH taken AS MATERIALIZED (
    SELECT o.id, o.dead_at
    FROM outbox o
    WHERE o.state = 'dead' AND o.redrives < @max_redrives::integer
      AND (@reason_class::text = '' OR o.reason_class = @reason_class::text)
      AND (NOT @new_key::boolean OR @force::boolean OR o.reason_class = ANY(@new_key_safe::text[]))
      AND (@new_key::boolean OR @force::boolean OR o.key_minted_at > now() - @key_window::interval)
      AND o.dead_at >= @since::timestamptz AND o.dead_at < @until::timestamptz
    ORDER BY o.dead_at, o.id
    LIMIT @max_rows::integer
    FOR UPDATE SKIP LOCKED
),
stop AS (
    SELECT t.dead_at, t.id FROM taken t
    WHERE (SELECT count(*) FROM taken) = @max_rows::integer
    ORDER BY t.dead_at DESC, t.id DESC
    LIMIT 1
),
walked AS (
    -- The rules above, as reasons; a rule that is not true passes the row by.
    SELECT o.id,
           CASE WHEN NOT coalesce(o.redrives < @max_redrives::integer, false) THEN 'redrive-limit'
                WHEN NOT coalesce(NOT @new_key::boolean OR @force::boolean OR o.reason_class = ANY(@new_key_safe::text[]), false)
                    THEN 'new-key-unsafe'
                WHEN NOT coalesce(@new_key::boolean OR @force::boolean OR o.key_minted_at > now() - @key_window::interval, false)
                    THEN 'key-may-be-forgotten'
                WHEN o.id NOT IN (SELECT id FROM taken) THEN 'busy'
           END AS passed_by
    FROM outbox o
    WHERE o.state = 'dead'
      AND (@reason_class::text = '' OR o.reason_class = @reason_class::text)
      AND o.dead_at >= @since::timestamptz AND o.dead_at < @until::timestamptz
      AND NOT EXISTS (SELECT 1 FROM stop WHERE (o.dead_at, o.id) > (stop.dead_at, stop.id))
)
SELECT coalesce((SELECT array_agg(t.id ORDER BY t.dead_at, t.id) FROM taken t), '{}')::bigint[] AS ids,
       (count(*) FILTER (WHERE w.passed_by = 'redrive-limit'))::integer AS redrive_limit,
       (count(*) FILTER (WHERE w.passed_by = 'new-key-unsafe'))::integer AS new_key_unsafe,
       (count(*) FILTER (WHERE w.passed_by = 'key-may-be-forgotten'))::integer AS key_may_be_forgotten,
       (count(*) FILTER (WHERE w.passed_by = 'busy'))::integer AS busy
FROM walked w;

-- name: Redrive :many
-- Brings dead rows back: due now, attempts and SENDER_MAX_AGE counted
-- afresh (the attempts so far are added to attempts_before_redrive). With new_key, the operation gets a new idempotency key and the
-- old one is kept in previous_keys; without, Users sees the same key again.
-- Rows that are no longer dead (another redrive won) are left alone, and so
-- is a new key for a row whose old key may have created a user (the answer
-- was lost, or never judged): only a refusal of Users' is safe to ask anew,
-- unless the operator forces it after checking Users. A retry keeps the
-- key, and sends it for another SENDER_MAX_AGE: it is left alone when the
-- key was minted more than @key_window ago (USERS_INBOX_RETENTION minus
-- SENDER_MAX_AGE), since Users may forget the key before that horizon
-- ends, and a key it forgot looks new; again unless forced. A row redriven
-- @max_redrives times already stays dead. A row another transaction has
-- locked is skipped, not waited for: the caller tells the operator to try
-- again, and no admin request queues behind a lock it cannot see.
UPDATE outbox o
SET state = 'pending', available_at = now(), attempts = 0, attempts_before_redrive = o.attempts_before_redrive + d.attempts,
    age_from = now(),
    dead_at = NULL, lease_token = NULL, claimed_by = NULL, last_error = NULL, reason_class = NULL,
    -- A fresh start: the next publish is not held back by an old one's,
    -- and goes out under a message id of its own, which the broker cannot
    -- drop as a repeat of one before the redrive.
    published_at = NULL, published_seq = NULL, publishes = o.publishes + 1,
    redrives = o.redrives + 1, redriven_at = now(),
    previous_keys = CASE WHEN @new_key::boolean THEN o.previous_keys || o.idempotency_key ELSE o.previous_keys END,
    idempotency_key = CASE WHEN @new_key::boolean THEN gen_random_uuid() ELSE o.idempotency_key END,
    key_minted_at = CASE WHEN @new_key::boolean THEN now() ELSE o.key_minted_at END
FROM (
    SELECT id, attempts FROM outbox
    WHERE id = ANY(@ids::bigint[]) AND state = 'dead' AND redrives < @max_redrives::integer
      AND (NOT @new_key::boolean OR @force::boolean OR reason_class = ANY(@new_key_safe::text[]))
      AND (@new_key::boolean OR @force::boolean OR key_minted_at > now() - @key_window::interval)
    FOR UPDATE SKIP LOCKED
) d
WHERE o.id = d.id
RETURNING o.id, o.idempotency_key, d.attempts AS attempts_before;
