-- +goose Up
-- Wakes the outbox sender when work becomes due now, instead of leaving it
-- to the next poll. The notification is sent when the writing transaction
-- commits and not at all if it rolls back, so a sender never wakes for a
-- row it cannot see yet. PostgreSQL folds identical notifications of one
-- transaction into one, and the sender folds bursts from many transactions
-- (sender.go), so a busy intake costs the sender one claim per batch, not
-- one per student.
--
-- The poll stays: a notification is lost while no sender listens (one is
-- restarting, or its connection broke), and rows retried after a backoff
-- become due by the clock, which sends nothing. A lost notification costs
-- at most one SENDER_POLL_INTERVAL.
--
-- The channel name is a contract with the sender (sender.NotifyChannel).

-- +goose StatementBegin
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_due', '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- New rows: once per INSERT statement, however many rows it wrote.
CREATE TRIGGER outbox_inserted AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- Redriven rows: a dead row made pending again is due at once. Per row, as
-- only a row trigger can look at the old and new state; the condition is
-- evaluated for every update, and is cheap.
CREATE TRIGGER outbox_redriven AFTER UPDATE OF state ON outbox
    FOR EACH ROW WHEN (OLD.state = 'dead' AND NEW.state = 'pending')
    EXECUTE FUNCTION outbox_notify();

-- +goose Down
DROP TRIGGER outbox_redriven ON outbox;
DROP TRIGGER outbox_inserted ON outbox;
DROP FUNCTION outbox_notify();
