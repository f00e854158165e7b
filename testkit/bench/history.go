package main

import (
	"context"
	"fmt"

	"github.com/google/uuid"
)

// seedHistory gives a latency run's fresh databases what a deployment's
// hold after it has run a while: that many students already linked to
// their users, each with its delivered outbox row and one event of history, the
// same users in Users, and statistics on all of it, as autovacuum keeps
// them.
//
// Without it a latency run measures a system installed a moment ago.
// Each session caches its plans at its first statements, made from the
// statistics of empty tables, and autovacuum looks at a database once a
// minute, longer than a run: so for the whole run the sender's recording
// joined the growing students and outbox_events tables by scanning them
// whole, once per recording, a cost no running deployment pays. The
// history's document numbers cannot meet those of the students the run
// sends (newStudent).
func seedHistory(ctx context.Context, d *databases, rows int) error {
	if rows == 0 {
		return nil
	}
	ids, users := make([]uuid.UUID, rows), make([]uuid.UUID, rows)
	names, emails, docs := make([]string, rows), make([]string, rows), make([]string, rows)
	for i := range rows {
		ids[i], users[i] = uuid.Must(uuid.NewV7()), uuid.New()
		names[i], emails[i], docs[i] = fmt.Sprintf("Graduate %d", i+1), fmt.Sprintf("graduate%d@example.com", i+1), fmt.Sprintf("graduate-%d", i+1)
	}
	if _, err := d.studentAdmin.Exec(ctx, `
		WITH s AS (
			INSERT INTO students (id, name, email, document_number, user_id)
			SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::uuid[])
			RETURNING id, name, email, document_number),
		o AS (
			INSERT INTO outbox (idempotency_key, operation, student_id, payload, state, attempts, delivered_at)
			SELECT gen_random_uuid(), 'create-user', id,
			       jsonb_build_object('name', name, 'email', email, 'document_number', document_number),
			       'delivered', 1, now()
			FROM s
			RETURNING id, idempotency_key)
		INSERT INTO outbox_events (outbox_id, kind, attempt, outcome, actor, idempotency_key)
		SELECT id, 'attempt', 1, 'delivered', 'bench', idempotency_key FROM o`,
		ids, names, emails, docs, users); err != nil {
		return fmt.Errorf("seed history in Student: %w", err)
	}
	if _, err := d.usersAdmin.Exec(ctx, `
		INSERT INTO users (id, name, email, document_number)
		SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[])`,
		users, names, emails, docs); err != nil {
		return fmt.Errorf("seed history in Users: %w", err)
	}
	if _, err := d.studentAdmin.Exec(ctx, "ANALYZE"); err != nil {
		return fmt.Errorf("analyze Student's database: %w", err)
	}
	if _, err := d.usersAdmin.Exec(ctx, "ANALYZE"); err != nil {
		return fmt.Errorf("analyze Users' database: %w", err)
	}
	return nil
}
