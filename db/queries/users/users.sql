-- name: InsertUser :one
-- ON CONFLICT names the partial unique index's predicate: when an enabled
-- user already holds the document number no row comes back, and the
-- transaction stays usable to store that outcome under the key.
INSERT INTO users (id, name, email, document_number)
VALUES (@id, @name, @email, @document_number)
ON CONFLICT (document_number) WHERE enabled DO NOTHING
RETURNING id, name, email, document_number, enabled, created_at;

-- name: GetUser :one
SELECT id, name, email, document_number, enabled, created_at
FROM users
WHERE id = @id;
