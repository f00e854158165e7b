-- +goose Up
-- With the broker, each command a row's sender means to reach Users is a
-- message of its own: its Nats-Msg-Id is the row's key and this count of
-- the publishes recorded for the row. A publish whose outcome the sender
-- does not know (its acknowledgement lost, the sender killed before it
-- recorded it) is sent again under the same id, and JetStream's
-- de-duplication window drops the copy. A publish after one Users read
-- and did not answer, or after a redrive, has a new id, so the broker
-- cannot swallow it as a repeat of the last. Users' inbox decides by the
-- key whatever the id.
ALTER TABLE outbox ADD COLUMN publishes integer NOT NULL DEFAULT 0 CHECK (publishes >= 0);
GRANT UPDATE (publishes) ON outbox TO outbox_sender;

-- +goose Down
ALTER TABLE outbox DROP COLUMN publishes;
