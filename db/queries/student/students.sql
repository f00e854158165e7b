-- name: InsertStudentWithOutbox :exec
-- The outbox half of the pattern, in one statement: the student and the
-- create-user outbox row that asks Users for its user, so both commit or
-- neither does. PostgreSQL runs a data-modifying WITH to completion, and
-- the outbox row takes the student's id from its RETURNING. Student's own
-- rule, one student per document number, is a unique index: a number
-- already taken fails the statement, and neither row is written. The id and
-- created_at come from Student, which answers with them before the
-- statement's result is known (the inbox stores that answer with the
-- key); updated_at stays the database's, as every later change sets it. trace_parent is the request's W3C traceparent, '' (stored as NULL)
-- when tracing is off: the sender continues that trace on every delivery.
WITH student AS (
    INSERT INTO students (id, name, email, document_number, created_at)
    VALUES (@id, @name, @email, @document_number, @created_at)
    RETURNING id
)
INSERT INTO outbox (idempotency_key, operation, student_id, payload, trace_parent)
SELECT @idempotency_key::uuid, @operation::text, student.id, @payload::jsonb, NULLIF(@trace_parent::text, '')
FROM student;

-- name: GetStudent :one
-- reason_class, never last_error: the full error names hosts and addresses
-- and is for operators (the sender's admin API), not for Student's clients.
SELECT s.id, s.name, s.email, s.document_number, s.user_id, s.created_at, s.updated_at,
       o.state AS outbox_state, o.attempts, o.reason_class, o.redrives, o.redriven_at
FROM students s
LEFT JOIN outbox o ON o.student_id = s.id AND o.operation = 'create-user'
WHERE s.id = @id;

-- name: ListStudents :many
-- Keyset pagination over (created_at, id): no repeats or gaps among the
-- rows that existed when paging began, and as fast on page 1,000 as on
-- page 1. created_at is Student's clock just before the insert, so a
-- student committed after a client paged past that time is not shown to
-- that client; a feed that must miss nothing would page by commit order.
SELECT s.id, s.name, s.email, s.document_number, s.user_id, s.created_at, s.updated_at,
       o.state AS outbox_state, o.attempts, o.reason_class, o.redrives, o.redriven_at
FROM students s
LEFT JOIN outbox o ON o.student_id = s.id AND o.operation = 'create-user'
WHERE (s.created_at, s.id) > (@after_created_at::timestamptz, @after_id::uuid)
ORDER BY s.created_at, s.id
LIMIT @page_size;
