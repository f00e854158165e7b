-- name: InsertUser :exec
-- The business rule is the partial unique index on enabled users' document
-- numbers: when an enabled user already holds the number, this insert fails
-- (a unique violation of users_one_enabled_per_document), and with it the
-- transaction it is in, so nothing of it is written. The store then stores
-- the refusal under the key instead. No ON CONFLICT: the statement goes out
-- with the key and its answer, in one batch, before its own result is known.
INSERT INTO users (id, name, email, document_number)
VALUES (@id, @name, @email, @document_number);

-- name: GetUser :one
SELECT id, name, email, document_number, enabled, created_at
FROM users
WHERE id = @id;
