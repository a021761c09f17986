-- Schema version 8: completions without the row lock of a BEFORE UPDATE trigger (issue 14: the
-- commit path).
--
-- Since version 3 a writer that stamps rev = nextval('render_schedule_rev_seq') itself skips the
-- PL/pgSQL rev trigger (its WHEN guard), but the guard comes too late to spare the row anything
-- else: on a table with any BEFORE UPDATE row trigger, PostgreSQL locks each row it updates (a
-- tuple lock, one more WAL record) and reads it again before it evaluates any such trigger's
-- WHEN, even a disabled trigger's. For a completion that was about a tenth of PostgreSQL's CPU
-- (docs/benchmarks.md, "A completion without the row lock").
--
-- From this version a one-table schema has no BEFORE UPDATE row trigger. The rev is still fresh
-- on every write; what the trigger did is done after the row, where PostgreSQL evaluates a WHEN
-- guard on the old and the new row without locking:
--
--   render_schedule_rev_update   now an AFTER UPDATE row trigger with the same guard, running
--                                render_schedule_mark_restamp() only for an update that changes
--                                the key (refused, as before) or does not move rev forward (an
--                                upsert or producer update that leaves rev alone, or sets it
--                                backwards or unchanged): it marks the statement, in the
--                                transaction-local setting renderqueue.restamp.
--   render_schedule_rev_restamp  an AFTER UPDATE statement trigger: for a marked statement it
--                                clears the mark and writes every row of the statement again with
--                                a fresh rev, in one UPDATE as the schema's owner (whose change
--                                events carry the fresh revs).
--   render_schedule_notify()     sends nothing for a marked statement: the rows' events are those
--                                of that second UPDATE.
--
-- So every row ends its statement with a fresh rev and its change event carries it, as before,
-- and the rev is compared per row, old with new, so concurrent writers cannot slip past it: an
-- update that waited for another transaction's write of the row compares with that write's rev.
-- What a writer sees differently: an UPDATE ... RETURNING that leaves rev alone returns the row's
-- old rev (the fresh one is written after the statement), and such an update writes its rows
-- twice, about twice the cost. Stamp rev = nextval('render_schedule_rev_seq') in the statement
-- (ON CONFLICT ... DO UPDATE SET ..., rev = nextval(...) for an upsert) to avoid both.
--
-- A partitioned schema (schema migrate --partitions) keeps the BEFORE trigger: an update that
-- changes the key can move the row to another partition, which PostgreSQL runs as a delete and
-- an insert without any AFTER UPDATE row trigger, so only a BEFORE trigger can refuse it there.

CREATE FUNCTION render_schedule_mark_restamp() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NEW.key IS DISTINCT FROM OLD.key THEN
        RAISE EXCEPTION 'render_schedule: key % cannot be changed to %; delete and insert instead', OLD.key, NEW.key
            USING ERRCODE = 'check_violation';
    END IF;
    IF current_setting('renderqueue.restamp', true) IS DISTINCT FROM 'on' THEN
        PERFORM set_config('renderqueue.restamp', 'on', true);
    END IF;
    RETURN NULL;
END
$fn$;

-- SECURITY DEFINER, as the BEFORE trigger's change of NEW.rev needed no privilege: a writer whose
-- role may update some columns only (not rev) keeps writing as before.
CREATE FUNCTION render_schedule_restamp() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $fn$
BEGIN
    IF current_setting('renderqueue.restamp', true) = 'on' THEN
        PERFORM set_config('renderqueue.restamp', '', true);
        UPDATE render_schedule AS r SET rev = nextval('render_schedule_rev_seq')
        FROM changed c WHERE r.key = c.key;
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER render_schedule_rev_restamp
    AFTER UPDATE ON render_schedule
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION render_schedule_restamp();

DO $do$
BEGIN
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = 'render_schedule'::regclass) = 'p' THEN
        RETURN; -- partitioned: the BEFORE UPDATE row trigger stays
    END IF;
    DROP TRIGGER render_schedule_rev_update ON render_schedule;
    CREATE TRIGGER render_schedule_rev_update
        AFTER UPDATE ON render_schedule
        FOR EACH ROW
        WHEN (NEW.key IS DISTINCT FROM OLD.key OR NOT (NEW.rev > OLD.rev))
        EXECUTE FUNCTION render_schedule_mark_restamp();
END
$do$;

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
    -- a statement render_schedule_mark_restamp() marked: render_schedule_rev_restamp writes its
    -- rows again with fresh revs, and that UPDATE sends their events
    IF TG_OP = 'UPDATE' AND current_setting('renderqueue.restamp', true) = 'on' THEN
        RETURN NULL;
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

-- CREATE OR REPLACE drops a function's settings: pin the search_path again (pg_catalog first,
-- pg_temp last) so no role can shadow what they call; the restamp's UPDATE writes this schema's
-- table whatever the writer's search_path.
DO $do$
DECLARE
    path text := format('pg_catalog, %I, pg_temp', current_schema());
BEGIN
    EXECUTE format('ALTER FUNCTION render_schedule_notify() SET search_path = %s', path);
    EXECUTE format('ALTER FUNCTION render_schedule_restamp() SET search_path = %s', path);
END
$do$;
