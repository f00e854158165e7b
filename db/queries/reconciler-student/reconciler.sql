-- The reconciler's reads of Student's database, as the read-only role
-- reconciler. Each is one short statement, bounded by the server's
-- statement_timeout (RECONCILER_STATEMENT_TIMEOUT), that takes no lock
-- beyond ACCESS SHARE and holds its snapshot only while it runs: no
-- transaction spans pages, so none holds back vacuum.

-- name: StudentNow :one
-- Student's clock, at the start of a pass: where the next incremental pass
-- starts reading.
SELECT now()::timestamptz AS now;

-- name: StudentsAfter :many
-- The full sweep: every student in id order, keyset-paged on the primary
-- key, each with its create-user outbox row (outbox_student_operation_key).
-- The join repeats the page's bound for the outbox: without it the
-- planner may merge the page with the outbox's index read from its first
-- entry, every page, and a sweep would cost the square of the table.
SELECT s.id, s.document_number, s.user_id, s.created_at,
       o.idempotency_key, o.state, o.reason_class, o.dead_at
FROM students s
LEFT JOIN outbox o ON o.student_id = s.id AND o.operation = 'create-user' AND o.student_id > @after_id::uuid
WHERE s.id > @after_id::uuid
ORDER BY s.id
LIMIT @page_size;

-- name: StudentsCreatedAfter :many
-- An incremental pass: the students created since the last pass, keyset-
-- paged along students_created_at_id_idx.
SELECT s.id, s.document_number, s.user_id, s.created_at,
       o.idempotency_key, o.state, o.reason_class, o.dead_at
FROM students s
LEFT JOIN outbox o ON o.student_id = s.id AND o.operation = 'create-user'
WHERE (s.created_at, s.id) > (@after_created_at::timestamptz, @after_id::uuid)
ORDER BY s.created_at, s.id
LIMIT @page_size;

-- name: StudentsByID :many
-- The students an outbox page names, or those a suspect case is read again
-- for.
SELECT s.id, s.document_number, s.user_id, s.created_at,
       o.idempotency_key, o.state, o.reason_class, o.dead_at
FROM students s
LEFT JOIN outbox o ON o.student_id = s.id AND o.operation = 'create-user'
WHERE s.id = ANY(@ids::uuid[]);

-- name: OutboxInStateAfter :many
-- The create-user rows in one state, oldest first by state_at (when the row
-- reached its state: its creation while it is pending or published),
-- keyset-paged along outbox_state_at_idx: every dead row, the rows
-- delivered since the last pass, the rows on their way since before a
-- cut-off.
SELECT o.id, o.state_at::timestamptz AS state_at, o.student_id
FROM outbox o
WHERE o.operation = 'create-user' AND o.state = @state
  AND (o.state_at, o.id) > (@after_at::timestamptz, @after_id::bigint)
  AND o.state_at < @before::timestamptz
ORDER BY o.state_at, o.id
LIMIT @page_size;

-- name: StudentsByKeys :many
-- Which students carry these keys now (outbox_idempotency_key_key): a user
-- made under one of them is accounted for.
SELECT o.idempotency_key, s.id, s.user_id
FROM outbox o
JOIN students s ON s.id = o.student_id
WHERE o.operation = 'create-user' AND o.idempotency_key = ANY(@keys::uuid[]);

-- name: StudentsLinkedTo :many
-- Which of these users some student is linked to. No index serves it (one
-- on students.user_id would cost every link the sender records), so it
-- reads the table: it runs only for the few users a pass suspects of
-- belonging to nobody.
SELECT DISTINCT s.user_id::uuid AS user_id
FROM students s
WHERE s.user_id = ANY(@user_ids::uuid[]);
