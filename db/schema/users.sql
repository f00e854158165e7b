-- db/schema/users.sql: the users database's schema after every migration in
-- db/migrations/users/, in one place for reading. Generated: do not edit.
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
-- Name: answers; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.answers (
    id bigint NOT NULL,
    message_id uuid NOT NULL,
    idempotency_key uuid NOT NULL,
    subject text NOT NULL,
    payload json NOT NULL,
    trace_parent text DEFAULT ''::text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone
);

--
-- Name: answers_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.answers ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.answers_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

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
-- Name: parked_commands; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.parked_commands (
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
-- Name: users; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.users (
    id uuid NOT NULL,
    name text NOT NULL,
    email text NOT NULL,
    document_number text NOT NULL,
    enabled boolean DEFAULT true NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: answers answers_message_id_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.answers
    ADD CONSTRAINT answers_message_id_key UNIQUE (message_id);

--
-- Name: answers answers_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.answers
    ADD CONSTRAINT answers_pkey PRIMARY KEY (id);

--
-- Name: inbox inbox_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.inbox
    ADD CONSTRAINT inbox_pkey PRIMARY KEY (caller, idempotency_key);

--
-- Name: parked_commands parked_commands_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.parked_commands
    ADD CONSTRAINT parked_commands_pkey PRIMARY KEY (stream, stream_sequence);

--
-- Name: users users_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.users
    ADD CONSTRAINT users_pkey PRIMARY KEY (id);

--
-- Name: answers_published_at_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX answers_published_at_idx ON public.answers USING btree (published_at) WHERE (published_at IS NOT NULL);

--
-- Name: answers_unpublished_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX answers_unpublished_idx ON public.answers USING btree (id) WHERE (published_at IS NULL);

--
-- Name: inbox_created_at_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX inbox_created_at_idx ON public.inbox USING btree (created_at);

--
-- Name: parked_commands_parked_at_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX parked_commands_parked_at_idx ON public.parked_commands USING btree (parked_at);

--
-- Name: users_one_enabled_per_document; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX users_one_enabled_per_document ON public.users USING btree (document_number) WHERE enabled;
