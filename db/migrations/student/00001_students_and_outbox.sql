-- +goose Up
-- Student's database: the students it owns and the outbox that carries the
-- work Student still needs another service to do. Both are written in one
-- local transaction, so a committed student always has its outbox row.

CREATE TABLE students (
    id              uuid        PRIMARY KEY,
    name            text        NOT NULL,
    email           text        NOT NULL,
    document_number text        NOT NULL,
    -- The Users-side id, recorded by the outbox sender once Users answers.
    user_id         uuid,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- One student per document number: a business rule of Student's own.
CREATE UNIQUE INDEX students_document_number_key ON students (document_number);

-- Keyset pagination walks (created_at, id) in order.
CREATE INDEX students_created_at_id_idx ON students (created_at, id);

CREATE TABLE outbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Sent as Idempotency-Key on every delivery of this operation, so Users
    -- can tell a retry from a new operation.
    idempotency_key uuid        NOT NULL UNIQUE,
    operation       text        NOT NULL CHECK (operation IN ('create-user')),
    student_id      uuid        NOT NULL REFERENCES students (id),
    payload         jsonb       NOT NULL,
    -- pending: waiting to be delivered (or being delivered, see lease_token);
    -- delivered: Users answered and the answer is recorded on the student;
    -- dead: given up on, last_error says why.
    state           text        NOT NULL DEFAULT 'pending'
                                CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- When the row is next due. A claim moves it forward by the lease, so a
    -- sender that dies mid-delivery leaves a row that becomes due again.
    available_at    timestamptz NOT NULL DEFAULT now(),
    -- Set by each claim; a sender may only record a retry or failure for a
    -- row whose token it still holds.
    lease_token     uuid,
    claimed_by      text,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    dead_at         timestamptz
);

-- The claim query's path: only pending rows, oldest due first.
CREATE INDEX outbox_due_idx ON outbox (available_at, id) WHERE state = 'pending';

-- One create-user operation per student.
CREATE UNIQUE INDEX outbox_student_operation_key ON outbox (student_id, operation);

-- Client requests to POST /students that carried an Idempotency-Key. Same
-- layout as Users' inbox (internal/inbox owns the queries for both): the
-- fingerprint decides whether a repeat is the same request, the stored
-- outcome is what the repeat gets back.
CREATE TABLE inbox (
    idempotency_key text        PRIMARY KEY,
    request_hash    bytea       NOT NULL,
    request         jsonb       NOT NULL,
    status_code     integer,
    response_body   text,
    -- The student created under this key, if any.
    resource_id     uuid,
    replays         integer     NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX inbox_created_at_idx ON inbox (created_at);

-- +goose Down
DROP TABLE inbox;
DROP TABLE outbox;
DROP TABLE students;
