-- Schema version 6: a writer-stamped rev is checked once per statement, not once per row
-- (issue 14: the commit path).
--
-- Version 3 let a writer stamp a fresh rev itself (SET rev = nextval('render_schedule_rev_seq'))
-- and skip the PL/pgSQL rev trigger, but its WHEN guard read the sequence for every row
-- (NEW.rev <= pg_sequence_last_value(...)): the relation is opened, locked and its page read
-- once per updated row. In `renderqueue bench` (2-core machine) the guard and the change events
-- together were about a third of PostgreSQL's CPU per completed row (docs/benchmarks.md).
--
-- From this version the row trigger's guard compares the row with itself only:
--
--   render_schedule_rev_update   runs render_schedule_set_rev() (a fresh rev; key changes
--                                refused) unless the update moves rev forward and keeps the key.
--                                An update that leaves rev alone (every upsert, every producer
--                                update) or sets it backwards or unchanged gets a fresh rev from
--                                the trigger, as before.
--   render_schedule_notify()     (the AFTER UPDATE statement trigger, which sees every updated
--                                row in its transition table) now first refuses the statement
--                                if any row's rev is past the sequence: a rev the sequence has
--                                not handed out would make every later, trigger-stamped write of
--                                the key look stale to the keepers. Such a statement fails with
--                                check_violation and writes nothing; before this version the
--                                trigger silently replaced that rev with a fresh one.
--
-- The sequence's last value only grows, so a rev that was handed out is at most the last value
-- read at any later time: the check at the statement's end is as safe as the per-row one.

DROP TRIGGER render_schedule_rev_update ON render_schedule;

CREATE TRIGGER render_schedule_rev_update
    BEFORE UPDATE ON render_schedule
    FOR EACH ROW
    WHEN (NEW.key IS DISTINCT FROM OLD.key OR NOT (NEW.rev > OLD.rev))
    EXECUTE FUNCTION render_schedule_set_rev();

CREATE OR REPLACE FUNCTION render_schedule_notify() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE
    deleted boolean := TG_OP = 'DELETE';
    ts text := floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint::text;
    ik bytea;
    ok bytea;
    top bigint;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        top := (SELECT max(c.rev) FROM changed c);
        IF top > coalesce(pg_sequence_last_value('render_schedule_rev_seq'::regclass), 0) THEN
            RAISE EXCEPTION 'render_schedule: rev % is past render_schedule_rev_seq; set rev = nextval(''render_schedule_rev_seq'') or leave rev alone', top
                USING ERRCODE = 'check_violation';
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
            ) e
        ) g
        GROUP BY g.grp, g.chunk
    ) p;
    RETURN NULL;
END
$fn$;

-- CREATE OR REPLACE drops a function's settings: pin the search_path again (pg_catalog first,
-- pg_temp last) so no role can shadow what they call.
DO $do$
BEGIN
    EXECUTE format('ALTER FUNCTION render_schedule_notify() SET search_path = %s',
                   format('pg_catalog, %I, pg_temp', current_schema()));
END
$do$;
