-- name: InsertUser :one
-- ON CONFLICT names the partial unique index's predicate: when an enabled
-- user already holds the document number no row comes back, and the
-- transaction stays usable to store that outcome under the key.
INSERT INTO users (id, name, email, document_number)
VALUES (@id, @name, @email, @document_number)
ON CONFLICT (document_number) WHERE enabled DO NOTHING
RETURNING id, name, email, document_number, enabled, created_at;

-- name: InsertNewUser :exec
-- The user of CreateUser's first try, which expects the document number to
-- be free: it goes out with the key and its stored answer, in one batch,
-- before its own answer is known, so it has no ON CONFLICT. When an enabled
-- user already holds the document number it fails (a unique violation of
-- users_one_enabled_per_document), the transaction with it, and nothing is
-- written: the store's refuse then stores the refusal with InsertUser.
INSERT INTO users (id, name, email, document_number)
VALUES (@id, @name, @email, @document_number);

-- name: GetUser :one
SELECT id, name, email, document_number, enabled, created_at
FROM users
WHERE id = @id;
