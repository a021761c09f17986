-- Schema version 9: keeper sessions (issue 39: leases survive a dead shard).
--
-- A keeper's leases live in its memory. When its process ends, the process that takes its slots
-- over (the same shard restarted, its Pod replaced) must not hand out a row the dead one may
-- have leased until that lease has ended. It can hold the rows back for the longest lease
-- (fencing by time), but only when it knows that a process before it may have granted leases:
-- a keeper that starts for the first time, or after a process that drained and ended cleanly,
-- holds nothing back. This table is how it knows.
--
--   renderqueue_keeper_sessions      one row per shard name: the process running it (a random
--                                    instance id), the Pod-local id of its state file (so that a
--                                    process restarted in the same Pod can trust that file's
--                                    bound), when it started, and — written by a clean exit —
--                                    when it ended and when its last lease ends. Nobody but the
--                                    schema owner may read or write it directly.
--   renderqueue_keeper_begin(shard, instance, pod)
--                                    SECURITY DEFINER, refused to any session whose role may
--                                    not read the signing key (the keepers' role, as
--                                    renderqueue_listen_slots): returns the shard's previous
--                                    session (no row: none) and records the new one.
--   renderqueue_keeper_end(shard, instance, leases_until)
--                                    the same gate: records a clean end of the session, if it is
--                                    still the shard's latest (true), with when its last lease
--                                    ends (NULL: it had none).

CREATE TABLE renderqueue_keeper_sessions (
    shard        text PRIMARY KEY,
    instance     text NOT NULL,
    pod          text NOT NULL,
    started_at   timestamptz NOT NULL,
    ended_at     timestamptz,
    leases_until timestamptz
);
REVOKE ALL ON renderqueue_keeper_sessions FROM PUBLIC;

CREATE FUNCTION renderqueue_keeper_begin(p_shard text, p_instance text, p_pod text)
RETURNS TABLE (instance text, pod text, started_at timestamptz, ended_at timestamptz, leases_until timestamptz)
LANGUAGE plpgsql SECURITY DEFINER AS $fn$
#variable_conflict use_column
BEGIN
    IF NOT has_function_privilege(session_user, 'renderqueue_event_key()', 'EXECUTE') THEN
        RAISE EXCEPTION 'renderqueue: only the keepers'' role may record a keeper session (it needs EXECUTE on renderqueue_event_key())'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN QUERY SELECT s.instance, s.pod, s.started_at, s.ended_at, s.leases_until
        FROM renderqueue_keeper_sessions s WHERE s.shard = p_shard FOR UPDATE;
    INSERT INTO renderqueue_keeper_sessions AS s (shard, instance, pod, started_at)
        VALUES (p_shard, p_instance, p_pod, now())
        ON CONFLICT (shard) DO UPDATE SET instance = EXCLUDED.instance, pod = EXCLUDED.pod,
            started_at = EXCLUDED.started_at, ended_at = NULL, leases_until = NULL;
END
$fn$;
GRANT EXECUTE ON FUNCTION renderqueue_keeper_begin(text, text, text) TO PUBLIC;

CREATE FUNCTION renderqueue_keeper_end(p_shard text, p_instance text, p_leases_until timestamptz) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $fn$
BEGIN
    IF NOT has_function_privilege(session_user, 'renderqueue_event_key()', 'EXECUTE') THEN
        RAISE EXCEPTION 'renderqueue: only the keepers'' role may record a keeper session (it needs EXECUTE on renderqueue_event_key())'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    UPDATE renderqueue_keeper_sessions s SET ended_at = now(), leases_until = p_leases_until
        WHERE s.shard = p_shard AND s.instance = p_instance;
    RETURN FOUND;
END
$fn$;
GRANT EXECUTE ON FUNCTION renderqueue_keeper_end(text, text, timestamptz) TO PUBLIC;

DO $do$
DECLARE
    path text := format('pg_catalog, %I, pg_temp', current_schema());
BEGIN
    EXECUTE format('ALTER FUNCTION renderqueue_keeper_begin(text, text, text) SET search_path = %s', path);
    EXECUTE format('ALTER FUNCTION renderqueue_keeper_end(text, text, timestamptz) SET search_path = %s', path);
END
$do$;
