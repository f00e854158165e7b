-- The reconciler's reads of Users' database, as the read-only role
-- reconciler: short statements, as on Student's side.

-- name: UsersNow :one
SELECT now()::timestamptz AS now;

-- name: AnswersByKeys :many
-- What Users stored under a page's keys for the sender's caller
-- (inbox_pkey).
SELECT idempotency_key, COALESCE(status_code, 0)::integer AS status_code, resource_id, created_at
FROM inbox
WHERE caller = @caller AND idempotency_key = ANY(@keys::text[]);

-- name: UsersByID :many
SELECT id, document_number, enabled, created_at
FROM users
WHERE id = ANY(@ids::uuid[]);

-- name: UsersAfter :many
-- The full sweep for users that belong to nobody: every user in id order,
-- keyset-paged on the primary key.
SELECT id, created_at
FROM users
WHERE id > @after_id::uuid
ORDER BY id
LIMIT @page_size;

-- name: EnabledUsersAfter :many
-- The full sweep for document numbers with more than one enabled user:
-- the enabled users in document order, so that those sharing one are
-- side by side, keyset-paged along users_one_enabled_per_document (the
-- plain >= is the range that index scans; the row comparison, which it
-- cannot, skips what the last page read). Where
-- that index is missing (a replica written by something else) each page
-- reads the table: slow, and still right.
SELECT document_number, id, created_at
FROM users
WHERE enabled AND document_number >= @after_document::text
  AND (document_number, id) > (@after_document::text, @after_id::uuid)
ORDER BY document_number, id
LIMIT @page_size;

-- name: EnabledUsersWithDocuments :many
SELECT document_number, id, created_at
FROM users
WHERE enabled AND document_number = ANY(@documents::text[]);

-- name: AnswersCreatedAfter :many
-- An incremental pass: the answers that made a user since the last pass,
-- of any caller, keyset-paged along inbox_created_at_idx (on created_at
-- alone, so the plain >= is its range). Users writes a
-- user and its answer in one transaction, so these are the users made
-- since then (bar those made by hand, which the full sweep finds).
SELECT caller, idempotency_key, resource_id::uuid AS resource_id, created_at
FROM inbox
WHERE resource_id IS NOT NULL AND created_at >= @after_at::timestamptz
  AND (created_at, caller, idempotency_key) > (@after_at::timestamptz, @after_caller::text, @after_key::text)
ORDER BY created_at, caller, idempotency_key
LIMIT @page_size;

-- name: AnswersForUsers :many
-- The answers that made these users, of any caller. No index serves it;
-- like StudentsLinkedTo it runs only for the few suspected orphans.
SELECT caller, idempotency_key, resource_id::uuid AS resource_id
FROM inbox
WHERE resource_id = ANY(@user_ids::uuid[]);
