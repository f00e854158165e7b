package main

import (
	"context"
	"fmt"

	"github.com/google/uuid"
)

// seedHistory gives a latency run's fresh databases what a deployment's
// hold after it has run a while: that many students already linked to
// their users, each with its delivered outbox row and one event of
// history, the same users in Users with their operations' keys and
// answers in its inbox, and statistics on those tables, as autovacuum
// keeps them.
//
// Without it a latency run measures a system installed a moment ago.
// Each session caches its plans at its first statements, made from the
// statistics of empty tables, and autovacuum looks at a database once a
// minute, longer than a run: so for the whole run the sender's recording
// joined the growing students and outbox_events tables by scanning them
// whole, once per recording, a cost no running deployment pays. (Users'
// inbox, analyzed empty, was scanned whole at every stored answer.) The
// history's document numbers cannot meet those of the students the run
// sends (newStudent).
func seedHistory(ctx context.Context, d *databases, rows int) error {
	if rows == 0 {
		return nil
	}
	ids, users, keys := make([]uuid.UUID, rows), make([]uuid.UUID, rows), make([]uuid.UUID, rows)
	names, emails, docs := make([]string, rows), make([]string, rows), make([]string, rows)
	for i := range rows {
		ids[i], users[i], keys[i] = uuid.Must(uuid.NewV7()), uuid.New(), uuid.New()
		names[i], emails[i], docs[i] = fmt.Sprintf("Graduate %d", i+1), fmt.Sprintf("graduate%d@example.com", i+1), fmt.Sprintf("graduate-%d", i+1)
	}
	if _, err := d.studentAdmin.Exec(ctx, `
		WITH s AS (
			INSERT INTO students (id, name, email, document_number, user_id)
			SELECT id, name, email, document_number, user_id
			FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::uuid[])
			     AS h(id, name, email, document_number, user_id)
			RETURNING id, name, email, document_number),
		o AS (
			INSERT INTO outbox (idempotency_key, operation, student_id, payload, state, attempts, delivered_at)
			SELECT k.key, 'create-user', s.id,
			       jsonb_build_object('name', s.name, 'email', s.email, 'document_number', s.document_number),
			       'delivered', 1, now()
			FROM s JOIN unnest($1::uuid[], $6::uuid[]) AS k(id, key) ON k.id = s.id
			RETURNING id, idempotency_key)
		INSERT INTO outbox_events (outbox_id, kind, attempt, outcome, actor, idempotency_key)
		SELECT id, 'attempt', 1, 'delivered', 'bench', idempotency_key FROM o`,
		ids, names, emails, docs, users, keys); err != nil {
		return fmt.Errorf("seed history in Student: %w", err)
	}
	// Users' inbox holds each operation's key and stored answer, as it
	// does for USERS_INBOX_RETENTION.
	if _, err := d.usersAdmin.Exec(ctx, `
		WITH u AS (
			INSERT INTO users (id, name, email, document_number)
			SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[])
			RETURNING id, name, email, document_number)
		INSERT INTO inbox (caller, idempotency_key, request_hash, request, status_code, response_body, resource_id)
		SELECT $6::text, k.key::text, sha256(r.request::text::bytea), r.request, 201, '{}', u.id
		FROM u
		JOIN unnest($1::uuid[], $5::uuid[]) AS k(id, key) ON k.id = u.id
		CROSS JOIN LATERAL (SELECT jsonb_build_object('name', u.name, 'email', u.email, 'document_number', u.document_number) AS request) r`,
		users, names, emails, docs, keys, senderCaller); err != nil {
		return fmt.Errorf("seed history in Users: %w", err)
	}
	// Only the tables the history fills: statistics that say a table is
	// empty (ANALYZE of an empty one) would have the plans scan it whole
	// as it grows, which a fresh table's missing statistics do not.
	if _, err := d.studentAdmin.Exec(ctx, "ANALYZE students, outbox, outbox_events"); err != nil {
		return fmt.Errorf("analyze Student's database: %w", err)
	}
	if _, err := d.usersAdmin.Exec(ctx, "ANALYZE users, inbox"); err != nil {
		return fmt.Errorf("analyze Users' database: %w", err)
	}
	return nil
}
