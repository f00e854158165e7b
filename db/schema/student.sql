-- db/schema/student.sql: the student database's schema after every migration in
-- db/migrations/student/, in one place for reading. Generated: do not edit.
--
-- Made by 'make schema' (go run ./testkit/withpostgres -- go run
-- ./testkit/schemadump/gen): the migrations applied to a throwaway database
-- as the migrate step applies them, then
--   pg_dump --schema-only --no-owner --no-privileges
-- without goose's version table and without pg_dump's SET preamble and
-- version lines. db/schema/schema_test.go fails when this file is stale.
-- The grants and the reasons are in the migrations themselves: pg_dump
-- leaves out the first (--no-privileges), and SQL comments never reach the
-- database.

--
-- Name: inbox; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.inbox (
    idempotency_key text NOT NULL,
    request_hash bytea NOT NULL,
    request jsonb NOT NULL,
    status_code integer,
    response_body text,
    resource_id uuid,
    replays integer DEFAULT 0 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    caller text DEFAULT ''::text NOT NULL
);

--
-- Name: outbox; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.outbox (
    id bigint NOT NULL,
    idempotency_key uuid NOT NULL,
    operation text NOT NULL,
    student_id uuid NOT NULL,
    payload jsonb NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    available_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_token uuid,
    claimed_by text,
    last_error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    delivered_at timestamp with time zone,
    dead_at timestamp with time zone,
    reason_class text,
    age_from timestamp with time zone DEFAULT now() NOT NULL,
    previous_keys uuid[] DEFAULT '{}'::uuid[] NOT NULL,
    redrives integer DEFAULT 0 NOT NULL,
    redriven_at timestamp with time zone,
    state_at timestamp with time zone GENERATED ALWAYS AS (COALESCE(dead_at, delivered_at, created_at)) STORED,
    trace_parent text,
    attempts_before_redrive integer DEFAULT 0 NOT NULL,
    key_minted_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    published_seq bigint,
    publishes integer DEFAULT 0 NOT NULL,
    CONSTRAINT outbox_attempts_before_redrive_check CHECK ((attempts_before_redrive >= 0)),
    CONSTRAINT outbox_attempts_check CHECK ((attempts >= 0)),
    CONSTRAINT outbox_operation_check CHECK ((operation = 'create-user'::text)),
    CONSTRAINT outbox_publishes_check CHECK ((publishes >= 0)),
    CONSTRAINT outbox_redrives_check CHECK ((redrives >= 0)),
    CONSTRAINT outbox_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'published'::text, 'delivered'::text, 'dead'::text])))
);

--
-- Name: outbox_events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.outbox_events (
    id bigint NOT NULL,
    outbox_id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    kind text NOT NULL,
    attempt integer NOT NULL,
    outcome text NOT NULL,
    reason_class text,
    error text,
    actor text NOT NULL,
    idempotency_key uuid NOT NULL,
    CONSTRAINT outbox_events_kind_check CHECK ((kind = ANY (ARRAY['attempt'::text, 'redrive'::text, 'reply'::text])))
);

--
-- Name: outbox_events_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.outbox_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.outbox_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: outbox_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.outbox ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.outbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: parked_replies; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.parked_replies (
    stream text NOT NULL,
    stream_sequence bigint NOT NULL,
    subject text NOT NULL,
    headers jsonb NOT NULL,
    data bytea NOT NULL,
    reason text NOT NULL,
    deliveries integer NOT NULL,
    parked_at timestamp with time zone DEFAULT now() NOT NULL,
    size integer NOT NULL
);

--
-- Name: reply_inbox; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.reply_inbox (
    message_id uuid NOT NULL,
    idempotency_key uuid NOT NULL,
    outbox_id bigint,
    outcome text NOT NULL,
    received_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: students; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.students (
    id uuid NOT NULL,
    name text NOT NULL,
    email text NOT NULL,
    document_number text NOT NULL,
    user_id uuid,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: inbox inbox_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.inbox
    ADD CONSTRAINT inbox_pkey PRIMARY KEY (caller, idempotency_key);

--
-- Name: outbox_events outbox_events_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox_events
    ADD CONSTRAINT outbox_events_pkey PRIMARY KEY (id);

--
-- Name: outbox outbox_idempotency_key_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_idempotency_key_key UNIQUE (idempotency_key);

--
-- Name: outbox outbox_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);

--
-- Name: parked_replies parked_replies_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.parked_replies
    ADD CONSTRAINT parked_replies_pkey PRIMARY KEY (stream, stream_sequence);

--
-- Name: reply_inbox reply_inbox_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.reply_inbox
    ADD CONSTRAINT reply_inbox_pkey PRIMARY KEY (message_id);

--
-- Name: students students_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.students
    ADD CONSTRAINT students_pkey PRIMARY KEY (id);

--
-- Name: inbox_created_at_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX inbox_created_at_idx ON public.inbox USING btree (created_at);

--
-- Name: outbox_delivered_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_delivered_idx ON public.outbox USING btree (delivered_at) WHERE (state = 'delivered'::text);

--
-- Name: outbox_due_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_due_idx ON public.outbox USING btree (available_at, id) WHERE (state = ANY (ARRAY['pending'::text, 'published'::text]));

--
-- Name: outbox_events_outbox_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_events_outbox_idx ON public.outbox_events USING btree (outbox_id, id);

--
-- Name: outbox_state_at_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_state_at_idx ON public.outbox USING btree (state, state_at DESC, id DESC);

--
-- Name: outbox_student_operation_key; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX outbox_student_operation_key ON public.outbox USING btree (student_id, operation);

--
-- Name: parked_replies_parked_at_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX parked_replies_parked_at_idx ON public.parked_replies USING btree (parked_at);

--
-- Name: reply_inbox_received_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX reply_inbox_received_idx ON public.reply_inbox USING btree (received_at);

--
-- Name: students_created_at_id_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX students_created_at_id_idx ON public.students USING btree (created_at, id);

--
-- Name: students_document_number_key; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX students_document_number_key ON public.students USING btree (document_number);

--
-- Name: outbox_events outbox_events_outbox_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox_events
    ADD CONSTRAINT outbox_events_outbox_id_fkey FOREIGN KEY (outbox_id) REFERENCES public.outbox(id) ON DELETE CASCADE;

--
-- Name: outbox outbox_student_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_student_id_fkey FOREIGN KEY (student_id) REFERENCES public.students(id);

--
-- Name: outbox_inserts; Type: PUBLICATION; Schema: -; Owner: -
--

CREATE PUBLICATION outbox_inserts WITH (publish = 'insert');

--
-- Name: outbox_inserts outbox; Type: PUBLICATION TABLE; Schema: public; Owner: -
--

ALTER PUBLICATION outbox_inserts ADD TABLE ONLY public.outbox;
