-- Schema version 7: completions without the change events nobody needs (issue 14: the commit
-- path).
--
-- A keeper applies the rows its own completions wrote from the statement's RETURNING. In steady
-- state the change events of those completions have no other reader: they cost PostgreSQL about
-- a third of a completion (building and signing the payloads, pg_notify, the listening backend)
-- and the keeper the work of receiving, checking and ignoring them. They are needed only when
-- another keeper holds the row's slot too: a receiver walking a slot it is being handed, a giver
-- that has not yet dropped a slot it gave, a replacement keeper loading while the old one still
-- completes. So every listener now says which slots it holds, and a keeper's completion sends
-- the events of exactly the rows whose slot some other live listener holds.
--
--   renderqueue_listeners            one row per listening keeper connection: its backend pid
--                                    and the slots it holds (bit n = slot n). Nobody but the
--                                    schema owner may read or write it directly.
--   renderqueue_listen_slots(bit)    SECURITY DEFINER, EXECUTE for everyone, but refused to any
--                                    session whose role may not read the signing key (EXECUTE on
--                                    renderqueue_event_key(): the keepers' role): records the
--                                    calling connection's slots (replacing what it recorded
--                                    before) and removes the rows of connections that are gone.
--                                    A keeper's listener calls it after every LISTEN change and
--                                    before it reports the change done, so before the keeper
--                                    walks the slots.
--   renderqueue.quiet_for            a setting a keeper's group commit sets in its transaction
--                                    to the pid of its own listener connection. The change-event
--                                    trigger then leaves out the rows whose slot no other live
--                                    listener holds — only when the session's role may read the
--                                    signing key: any other writer's rows are always sent (a
--                                    producer that could go quiet would hide its writes from
--                                    every keeper; a role that can read the key could forge
--                                    events anyway). Rows of listeners whose connection is gone
--                                    do not count: that keeper has lost its events already and
--                                    walks once it is back, registered again.
--
-- The migration ends by sending a signed "7" on rq_schema: listeners connected before it
-- reconnect (a gap and a walk each) and record their slots then.
--
-- Why no event is missed (docs/design.md, "Quiet completions"): a quiet statement takes a SHARE lock
-- on renderqueue_listeners before it reads it, and holds it to its commit; a registration writes
-- the table, which waits for every such lock. So a listener's registration either commits before
-- a quiet statement reads the table (which then sees it and sends that listener's rows), or
-- waits until that statement's transaction has committed — and the listener's walk, which starts
-- after its registration, reads those rows as written.

CREATE TABLE renderqueue_listeners (
    pid        integer PRIMARY KEY,
    slots      bit(1024) NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON renderqueue_listeners FROM PUBLIC;

CREATE FUNCTION renderqueue_listen_slots(slots bit(1024)) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $fn$
BEGIN
    IF NOT has_function_privilege(session_user, 'renderqueue_event_key()', 'EXECUTE') THEN
        RAISE EXCEPTION 'renderqueue: only the keepers'' role may register a listener (it needs EXECUTE on renderqueue_event_key())'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    DELETE FROM renderqueue_listeners l
    WHERE l.pid <> pg_backend_pid()
      AND l.pid NOT IN (SELECT pg_stat_get_backend_pid(b) FROM pg_stat_get_backend_idset() AS b);
    INSERT INTO renderqueue_listeners AS l (pid, slots) VALUES (pg_backend_pid(), slots)
    ON CONFLICT (pid) DO UPDATE SET slots = EXCLUDED.slots, updated_at = now();
END
$fn$;
GRANT EXECUTE ON FUNCTION renderqueue_listen_slots(bit) TO PUBLIC;

CREATE OR REPLACE FUNCTION render_schedule_notify() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE
    deleted boolean := TG_OP = 'DELETE';
    ts text := floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint::text;
    ik bytea;
    ok bytea;
    top bigint;
    quiet text := current_setting('renderqueue.quiet_for', true);
    noisy bit(1024); -- NULL: every row is sent; else the slots whose rows are
BEGIN
    IF TG_OP = 'UPDATE' THEN
        top := (SELECT max(c.rev) FROM changed c);
        IF top > coalesce(pg_sequence_last_value('render_schedule_rev_seq'::regclass), 0) THEN
            RAISE EXCEPTION 'render_schedule: rev % is past render_schedule_rev_seq; set rev = nextval(''render_schedule_rev_seq'') or leave rev alone', top
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    IF quiet IS NOT NULL AND quiet <> '' AND NOT deleted THEN
        IF has_function_privilege(session_user, 'renderqueue_event_key()', 'EXECUTE') THEN
            LOCK TABLE renderqueue_listeners IN SHARE MODE;
            SELECT coalesce(bit_or(l.slots), repeat('0', 1024)::bit(1024)) INTO noisy
            FROM renderqueue_listeners l
            WHERE l.pid <> quiet::integer
              AND l.pid IN (SELECT pg_stat_get_backend_pid(b) FROM pg_stat_get_backend_idset() AS b);
            IF position(B'1' IN noisy) = 0 THEN
                RETURN NULL;
            END IF;
        END IF;
    END IF;
    -- renderqueue_sign inlined: the key is read once per statement, not once per payload
    SELECT e.ikey, e.okey INTO ik, ok FROM renderqueue_event_key e;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'renderqueue: the change-event signing key is missing; run SELECT renderqueue_rotate_event_key() as the schema owner';
    END IF;
    PERFORM pg_notify(p.channel, '2' || ts || ','
                      || encode(sha256(ok || sha256(ik || convert_to(p.channel || ',' || ts || ',' || p.body, 'UTF8'))), 'hex')
                      || ',' || p.body)
    FROM (
        SELECT 'rq_slots_' || g.grp AS channel, string_agg(g.entry, '' ORDER BY g.n) AS body
        FROM (
            SELECT e.grp, e.n, e.entry,
                   coalesce(sum(octet_length(e.entry)) OVER (PARTITION BY e.grp ORDER BY e.n
                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) / 5000 AS chunk
            FROM (
                SELECT (c.key_hash >> 58) + 32 AS grp, -- ((key_hash >> 54) + 512) / 16
                       row_number() OVER () AS n,
                       (CASE WHEN deleted THEN nextval('render_schedule_rev_seq') ELSE c.rev END)::text
                       || ',' || c.key_hash::text
                       || ',' || coalesce((extract(epoch FROM c.due_at) * 1000000)::bigint::text, '')
                       || ',' || c.cadence_ms::text
                       || ',' || ((CASE WHEN c.source = 'submitted' THEN 1 ELSE 0 END)
                                  + (CASE WHEN c.urgent THEN 2 ELSE 0 END)
                                  + (CASE WHEN deleted THEN 4 ELSE 0 END))::text
                       || ',' || octet_length(c.key)::text || ':' || c.key
                       || octet_length(c.route)::text || ':' || c.route AS entry
                FROM changed c
                WHERE noisy IS NULL OR get_bit(noisy, ((c.key_hash >> 54) + 512)::integer) = 1
            ) e
        ) g
        GROUP BY g.grp, g.chunk
    ) p;
    RETURN NULL;
END
$fn$;

-- CREATE OR REPLACE drops a function's settings: pin the search_path (pg_catalog first, pg_temp
-- last) so no role can shadow what they call.
DO $do$
DECLARE
    path text := format('pg_catalog, %I, pg_temp', current_schema());
BEGIN
    EXECUTE format('ALTER FUNCTION render_schedule_notify() SET search_path = %s', path);
    EXECUTE format('ALTER FUNCTION renderqueue_listen_slots(bit) SET search_path = %s', path);
END
$do$;

-- Every listener connected before this version has recorded no slots, and a keeper that
-- reconnects after it would go quiet while such a listener holds the same slots: the signed "7"
-- on rq_schema makes every current listener reconnect (a gap, then a walk), recording its slots.
SELECT pg_notify('rq_schema', renderqueue_sign('rq_schema', '7'));
