-- Schema version 4.

-- ============================================================================================
-- Change events on slot-group channels (issue 14).
--
-- Until version 3 each slot's rows went to channel rq_slot_<slot> (1,024 channels): a statement
-- touching rows of 400 slots sent and signed 400 notifications, and every listening backend
-- compared each queued notification with its list of LISTENed channels one by one. From version 4
-- the rows of each group of 16 adjacent slots go to one channel:
--
--   rq_slots_<group>   group = slot / 16, 0..63 (slots 16*group .. 16*group+15);
--                      slot = (key_hash >> 54) + 512, so group = (key_hash >> 58) + 32
--
-- A shard owns runs of adjacent slots, so it listens on about as many channels as it owns
-- groups; its subscription (pkg/store/postgres/changes) drops the entries of slots it does not
-- hold. Payloads are format 2 of 0002_signed_events.sql unchanged: a group's entries are cut into
-- payloads when the bytes before an entry pass a multiple of 5000 (each payload under 7500
-- bytes, below PostgreSQL's 8000), each signed with the key over its channel name, the signing
-- time and the body. TRUNCATE sends a signed "T" on every group channel.
--
--   renderqueue_schema_version()  SECURITY DEFINER, EXECUTE for everyone: the schema's version,
--                                 which a keeper reads each time its listener connects, to
--                                 listen on slot channels (no such function: version 3 or
--                                 older) or on group channels (4 or newer).
--   rq_schema                     the channel a listener always LISTENs on: a migration that
--                                 changes where change events go sends a signed payload (body:
--                                 the new version) there in its transaction, and a listener
--                                 reconnects (a gap), reading the version again.
--   renderqueue_event_key()       now refuses sessions that have not declared, with
--                                 SET renderqueue.event_channels = 'rq_slots', that they listen
--                                 on group channels: a keeper built before this version would
--                                 listen on slot channels nobody sends on and never see an
--                                 event, so it fails to connect instead (and says to upgrade it).
--
-- This migration ends by sending, in its transaction, a signed "4" on rq_schema and a signed "T"
-- (the TRUNCATE gap) on every slot channel rq_slot_0 .. rq_slot_1023: a current keeper listening
-- on slot channels (it connected while the schema was older) reconnects and listens on group
-- channels; an older keeper signals a gap and walks, and from then on receives nothing. Upgrade
-- the keepers before migrating to version 4 (README.md, "Upgrading").
-- ============================================================================================

CREATE OR REPLACE FUNCTION render_schedule_notify() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE
    deleted boolean := TG_OP = 'DELETE';
    ts text := floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint::text;
    ik bytea;
    ok bytea;
BEGIN
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

CREATE OR REPLACE FUNCTION render_schedule_notify_truncate() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $fn$
BEGIN
    PERFORM pg_notify('rq_slots_' || g, renderqueue_sign('rq_slots_' || g, 'T')) FROM generate_series(0, 63) AS g;
    RETURN NULL;
END
$fn$;

CREATE FUNCTION renderqueue_schema_version() RETURNS integer
LANGUAGE sql STABLE SECURITY DEFINER AS $fn$
    SELECT coalesce(max(version), 0) FROM renderqueue_schema_migrations
$fn$;
GRANT EXECUTE ON FUNCTION renderqueue_schema_version() TO PUBLIC;

-- CREATE OR REPLACE keeps the function's owner and grants (EXECUTE for the keepers' role).
CREATE OR REPLACE FUNCTION renderqueue_event_key() RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $fn$
BEGIN
    IF current_setting('renderqueue.event_channels', true) IS DISTINCT FROM 'rq_slots' THEN
        RAISE EXCEPTION 'renderqueue: this keeper is older than the schema (version 4 sends change events on slot-group channels rq_slots_<n>; the keeper would listen on rq_slot_<n> and receive none): upgrade the keepers'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'A current keeper runs SET renderqueue.event_channels = ''rq_slots'' before calling renderqueue_event_key().';
    END IF;
    RETURN (SELECT encode(k.key, 'hex') FROM renderqueue_event_key k);
END
$fn$;

-- CREATE OR REPLACE drops a function's settings: pin the search_path again (pg_catalog first,
-- pg_temp last) so no role can shadow what they call.
DO $do$
DECLARE
    path text := format('pg_catalog, %I, pg_temp', current_schema());
BEGIN
    EXECUTE format('ALTER FUNCTION render_schedule_notify() SET search_path = %s', path);
    EXECUTE format('ALTER FUNCTION render_schedule_notify_truncate() SET search_path = %s', path);
    EXECUTE format('ALTER FUNCTION renderqueue_schema_version() SET search_path = %s', path);
    EXECUTE format('ALTER FUNCTION renderqueue_event_key() SET search_path = %s', path);
END
$do$;

-- The switch: current listeners reconnect (rq_schema, sent first, so they take the slot
-- channels' "T" that follows as part of that one gap); older ones see a gap on their slot channels.
SELECT pg_notify('rq_schema', renderqueue_sign('rq_schema', '4'));
SELECT pg_notify('rq_slot_' || s, renderqueue_sign('rq_slot_' || s, 'T')) FROM generate_series(0, 1023) AS s;
-- ============================================================================================
-- End of the slot-group channels section.
-- ============================================================================================
