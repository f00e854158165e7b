-- The change-data-capture source's queries (outbox-sender/cdc). Each claim
-- takes the same lease and returns the same columns as ClaimDue
-- (outbox.sql), so that rows from every source share one delivery path.

-- name: ClaimDueLeavingNew :many
-- ClaimDue for a sender whose new rows come from the stream: a new row is
-- the stream's (ClaimStreamed) for @leave_new, so the poll takes only rows
-- tried before, redriven, or missed by the stream. While the stream keeps
-- up, the rows it leaves are few (it claims each within milliseconds); when
-- it falls far behind, this scan reads past all of them at each poll. An
-- index on retried rows alone would avoid that, at the price of an index
-- entry for every claim.
UPDATE outbox o
SET state        = 'pending',
    available_at = now() + @lease::interval,
    lease_token  = gen_random_uuid(),
    claimed_by   = @claimed_by,
    attempts     = o.attempts + 1
FROM (
    SELECT id FROM outbox
    WHERE state IN ('pending', 'published') AND available_at <= now()
      AND (attempts > 0 OR redrives > 0 OR available_at <= now() - @leave_new::interval)
    ORDER BY available_at, id
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
) due
WHERE o.id = due.id
RETURNING o.id, o.idempotency_key, o.operation, o.student_id, o.payload, o.attempts,
          o.lease_token::uuid AS lease_token, o.created_at, o.trace_parent,
          (o.age_from + @max_age::interval < now())::boolean AS expired,
          (o.age_from + @max_age::interval)::timestamptz AS expires_at,
          -- The broker transport's last publish of the row, if any: where
          -- its command sits in the stream, and how long ago the broker
          -- took it (SENDER_TRANSPORT=nats).
          COALESCE(o.published_seq, 0)::bigint AS published_seq, o.publishes,
          (now() - COALESCE(o.published_at, now()))::interval AS published_ago;

-- name: ClaimStreamed :many
-- Claims the rows whose inserts the stream announced, as ClaimDue claims
-- due rows, with the same lease and the same answer, so that both sources
-- share one delivery path. A row not returned is settled as far as the
-- stream is concerned: it is delivered or dead, leased (by any sender, this
-- one included), or locked by another transaction this moment (a claim or
-- a recording). Whichever it is, the table carries it from there: a lease
-- that runs out, or a lock whose transaction rolls back, leaves the row
-- due for the poll.
UPDATE outbox o
SET available_at = now() + @lease::interval,
    lease_token  = gen_random_uuid(),
    claimed_by   = @claimed_by,
    attempts     = o.attempts + 1
FROM (
    SELECT id FROM outbox
    WHERE id = ANY(@ids::bigint[]) AND state = 'pending' AND available_at <= now()
    ORDER BY id
    FOR UPDATE SKIP LOCKED
) due
WHERE o.id = due.id
RETURNING o.id, o.idempotency_key, o.operation, o.student_id, o.payload, o.attempts,
          o.lease_token::uuid AS lease_token, o.created_at, o.trace_parent,
          (o.age_from + @max_age::interval < now())::boolean AS expired,
          (o.age_from + @max_age::interval)::timestamptz AS expires_at,
          -- The broker transport's last publish of the row, if any: where
          -- its command sits in the stream, and how long ago the broker
          -- took it (SENDER_TRANSPORT=nats).
          COALESCE(o.published_seq, 0)::bigint AS published_seq, o.publishes,
          (now() - COALESCE(o.published_at, now()))::interval AS published_ago;

-- name: VisibleOutboxIDs :many
-- Which of these rows this transaction can see at all. A row the stream
-- announced may not be visible yet: with synchronous commits, PostgreSQL
-- flushes a commit record (which the stream can then decode and send)
-- before the committing transaction shows as committed to others. A row
-- ClaimStreamed did not return is claimed once more, and settled only if
-- that claim, begun after this query saw the row, misses it too.
SELECT id FROM outbox WHERE id = ANY(@ids::bigint[]);
