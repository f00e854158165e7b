-- name: InsertStudentWithOutbox :one
-- The outbox half of the pattern, in one statement: the student and the
-- create-user outbox row that asks Users for its user. Both inserts are in
-- the caller's transaction, so both commit or neither does. ON CONFLICT
-- keeps the transaction usable when the document number is taken: no
-- student is inserted, so the outbox insert selects no row either, no row
-- comes back and the handler answers 409. PostgreSQL runs a data-modifying
-- WITH to completion whether or not the main query reads it, so the outbox
-- row is written although only the student is returned (student_app may not
-- read the outbox row back: its payload is the sender's). trace_parent is
-- the request's W3C traceparent, '' (stored as NULL) when tracing is off:
-- the sender continues that trace on every delivery attempt.
WITH student AS (
    INSERT INTO students (id, name, email, document_number)
    VALUES (@id, @name, @email, @document_number)
    ON CONFLICT (document_number) DO NOTHING
    RETURNING id, name, email, document_number, user_id, created_at, updated_at
), outbox_row AS (
    INSERT INTO outbox (idempotency_key, operation, student_id, payload, trace_parent)
    SELECT @idempotency_key::uuid, @operation::text, student.id, @payload::jsonb, NULLIF(@trace_parent::text, '')
    FROM student
)
SELECT id, name, email, document_number, user_id, created_at, updated_at
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
-- page 1. created_at is the inserting transaction's start, so a student
-- committed after a client paged past that time is not shown to that
-- client; a feed that must miss nothing would page by commit order.
SELECT s.id, s.name, s.email, s.document_number, s.user_id, s.created_at, s.updated_at,
       o.state AS outbox_state, o.attempts, o.reason_class, o.redrives, o.redriven_at
FROM students s
LEFT JOIN outbox o ON o.student_id = s.id AND o.operation = 'create-user'
WHERE (s.created_at, s.id) > (@after_created_at::timestamptz, @after_id::uuid)
ORDER BY s.created_at, s.id
LIMIT @page_size;
