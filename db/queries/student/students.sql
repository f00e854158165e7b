-- name: InsertStudent :one
-- ON CONFLICT keeps the transaction usable when the document number is
-- taken: no row comes back and the handler answers 409.
INSERT INTO students (id, name, email, document_number)
VALUES (@id, @name, @email, @document_number)
ON CONFLICT (document_number) DO NOTHING
RETURNING id, name, email, document_number, user_id, created_at, updated_at;

-- name: InsertOutboxRow :exec
INSERT INTO outbox (idempotency_key, operation, student_id, payload)
VALUES (@idempotency_key, @operation, @student_id, @payload);

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
