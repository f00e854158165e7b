-- The change-data-capture source's queries (outbox-sender/sender/cdc.go).

-- name: ClaimStreamed :many
-- Claims the rows whose inserts the stream announced, as ClaimDue claims
-- due rows, with the same lease and the same answer, so that both sources
-- share one delivery path. A row not returned is settled as far as the
-- stream is concerned: it is delivered or dead, leased (by any sender, this
-- one included), or locked by another transaction this moment (a claim or
-- a recording). Whichever it is, the table carries it from there: a lease
-- that runs out, or a lock whose transaction rolls back, leaves the row
-- due for the poll.
WITH no_flush_wait AS (SELECT set_config('synchronous_commit', 'off', true))
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
) due, no_flush_wait
WHERE o.id = due.id
RETURNING o.id, o.idempotency_key, o.operation, o.student_id, o.payload, o.attempts,
          o.lease_token::uuid AS lease_token, o.created_at, o.trace_parent,
          (o.age_from + @max_age::interval < now())::boolean AS expired;

-- name: VisibleOutboxIDs :many
-- Which of these rows this transaction can see at all. A row the stream
-- announced may not be visible yet: with synchronous commits, PostgreSQL
-- flushes a commit record (which the stream can then decode and send)
-- before the committing transaction shows as committed to others. A row
-- ClaimStreamed did not return is claimed once more, and settled only if
-- that claim, begun after this query saw the row, misses it too.
SELECT id FROM outbox WHERE id = ANY(@ids::bigint[]);
