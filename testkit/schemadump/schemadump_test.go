package schemadump

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// rawDump is the shape of pg_dump's plain output, with what newer
// versions add (\restrict, transaction_timeout) and a function whose body
// has a line starting with SET.
const rawDump = `\restrict Xo8dJ2kq

--
-- PostgreSQL database dump
--

-- Dumped from database version 17.6 (Debian 17.6-1)
-- Dumped by pg_dump version 17.6 (Debian 17.6-1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET transaction_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: touch(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.touch() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
SET LOCAL x.y = 1;
RETURN NEW;
END $$;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: t; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.t (
    id bigint NOT NULL
);


--
-- PostgreSQL database dump complete
--

\unrestrict Xo8dJ2kq

`

func TestNormalise(t *testing.T) {
	t.Parallel()
	want := `--
-- Name: touch(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.touch() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
SET LOCAL x.y = 1;
RETURN NEW;
END $$;

--
-- Name: t; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.t (
    id bigint NOT NULL
);
`
	require.Equal(t, want, string(Normalise([]byte(rawDump))))
	// The same dump from another version, or with Windows line ends, is
	// the same snapshot.
	other := strings.ReplaceAll(rawDump, "17.6 (Debian 17.6-1)", "15.14")
	other = strings.ReplaceAll(other, "Xo8dJ2kq", "P1aQ")
	require.Equal(t, want, string(Normalise([]byte(other))))
	require.Equal(t, want, string(Normalise([]byte(strings.ReplaceAll(rawDump, "\n", "\r\n")))))
}

func TestDiff(t *testing.T) {
	t.Parallel()
	committed := "a\nb\nc\nd\ne\nf\ng\nh\ni\n"
	require.Empty(t, Diff([]byte(committed), []byte(committed)))

	fresh := "a\nb\nc\nd\nE\nf\ng\nh\ni\nj\n"
	// Changes closer than twice the context share a hunk.
	require.Equal(t, `first difference at line 5:
  committed: e
  fresh:     E
--- committed
+++ fresh
@@ committed line 2 @@
 b
 c
 d
-e
+E
 f
 g
 h
 i
+j
 
`, Diff([]byte(committed), []byte(fresh)))

	far := strings.Replace(committed, "i\n", "I\n", 1)
	far = strings.Replace(far, "a\n", "A\n", 1)
	require.Equal(t, `first difference at line 1:
  committed: a
  fresh:     A
--- committed
+++ fresh
@@ committed line 1 @@
-a
+A
 b
 c
 d
@@ committed line 6 @@
 f
 g
 h
-i
+I
 
`, Diff([]byte(committed), []byte(far)))

	require.Contains(t, Diff([]byte("a\nb\n"), []byte("a\n")), "first difference at line 2")
	require.Contains(t, Diff([]byte("a\n"), []byte("a\nb\n")), "first difference at line 2")

	// A very different snapshot shows a bounded diff.
	long := strings.Repeat("x\n", 500)
	require.Contains(t, Diff([]byte(long), []byte(strings.Repeat("y\n", 500))), "more changes left out")
	require.Less(t, strings.Count(Diff([]byte(long), []byte(strings.Repeat("y\n", 500))), "\n"), 2*maxDiffLines)
}
