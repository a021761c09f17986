-- Signed change events (docs/security.md, "Database").
--
-- Any role that can connect may pg_notify on a slot channel. So that a keeper never applies an
-- event the schema's triggers did not send, every payload is signed with HMAC-SHA-256 under a
-- key only this schema's owner can read:
--
--   renderqueue_event_key        the key (64 random bytes) and its HMAC pads; no privilege for
--                                anyone but the owner.
--   renderqueue_sign(ch, body)   the signed payload of body on channel ch; EXECUTE for nobody but
--                                the owner (the triggers run it as the owner).
--   renderqueue_event_key()      SECURITY DEFINER: the key, hex-encoded, for keepers to verify
--                                with; EXECUTE for nobody but the owner until granted to the
--                                keepers' role: GRANT EXECUTE ON FUNCTION renderqueue_event_key()
--                                TO <keeper role>.
--   renderqueue_rotate_event_key()  a new key (owner only); keepers fetch it on their next bad
--                                signature.
--   render_schedule_notify(), render_schedule_notify_truncate()  now SECURITY DEFINER, so
--                                producers' writes are signed without producers reading the key
--                                (render_schedule_notify signs as renderqueue_sign does, inline,
--                                with one signing time per statement).
--
-- Payload format 2 (replacing format 1 of 0001):
--   "2" ts "," mac "," body
-- ts   microseconds since the Unix epoch of the trigger's clock_timestamp() (keepers refuse
--      payloads far from the database's clock, and each payload once: no replays);
-- mac  lower-case hex HMAC-SHA-256 under the key of: channel "," ts "," body (UTF-8);
-- body the entries of format 1 (without its leading "1"), or "T" for a TRUNCATE.
--
-- HMAC is built from the built-in sha256() (PostgreSQL 11+): H((K^opad) || H((K^ipad) || m)),
-- with the pads computed once per key. No extension is needed; gen_random_uuid() (built in since
-- PostgreSQL 13, from the server's strong random source) supplies 4 x 122 random bits.

CREATE TABLE renderqueue_event_key (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    key        bytea NOT NULL CHECK (octet_length(key) = 64),
    ikey       bytea NOT NULL CHECK (octet_length(ikey) = 64),
    okey       bytea NOT NULL CHECK (octet_length(okey) = 64),
    created_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON renderqueue_event_key FROM PUBLIC;

CREATE FUNCTION renderqueue_rotate_event_key() RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    k  bytea := decode(replace(gen_random_uuid()::text || gen_random_uuid()::text
                               || gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex');
    ik bytea := k;
    ok bytea := k;
BEGIN
    FOR i IN 0..63 LOOP
        ik := set_byte(ik, i, get_byte(k, i) # 54); -- 0x36
        ok := set_byte(ok, i, get_byte(k, i) # 92); -- 0x5c
    END LOOP;
    INSERT INTO renderqueue_event_key (id, key, ikey, okey) VALUES (true, k, ik, ok)
    ON CONFLICT (id) DO UPDATE SET key = EXCLUDED.key, ikey = EXCLUDED.ikey, okey = EXCLUDED.okey, created_at = now();
END
$fn$;
REVOKE EXECUTE ON FUNCTION renderqueue_rotate_event_key() FROM PUBLIC;
SELECT renderqueue_rotate_event_key();

CREATE FUNCTION renderqueue_sign(channel text, body text) RETURNS text
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    ts text := floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint::text;
    ik bytea;
    ok bytea;
BEGIN
    SELECT e.ikey, e.okey INTO ik, ok FROM renderqueue_event_key e;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'renderqueue: the change-event signing key is missing; run SELECT renderqueue_rotate_event_key() as the schema owner';
    END IF;
    RETURN '2' || ts || ',' || encode(sha256(ok || sha256(ik || convert_to(channel || ',' || ts || ',' || body, 'UTF8'))), 'hex')
        || ',' || body;
END
$fn$;
REVOKE EXECUTE ON FUNCTION renderqueue_sign(text, text) FROM PUBLIC;

CREATE FUNCTION renderqueue_event_key() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER AS $fn$
    SELECT encode(key, 'hex') FROM renderqueue_event_key
$fn$;
REVOKE EXECUTE ON FUNCTION renderqueue_event_key() FROM PUBLIC;

-- The notify functions of 0001, now signing and SECURITY DEFINER. Their search_path is pinned
-- (pg_catalog first, pg_temp last) so no role can shadow what they call.
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
        SELECT 'rq_slot_' || g.slot AS channel, string_agg(g.entry, '' ORDER BY g.n) AS body
        FROM (
            SELECT e.slot, e.n, e.entry,
                   coalesce(sum(octet_length(e.entry)) OVER (PARTITION BY e.slot ORDER BY e.n
                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) / 5000 AS chunk
            FROM (
                SELECT (c.key_hash >> 54) + 512 AS slot,
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
        GROUP BY g.slot, g.chunk
    ) p;
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION render_schedule_notify_truncate() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $fn$
BEGIN
    PERFORM pg_notify('rq_slot_' || s, renderqueue_sign('rq_slot_' || s, 'T')) FROM generate_series(0, 1023) AS s;
    RETURN NULL;
END
$fn$;

DO $do$
DECLARE
    path text := format('pg_catalog, %I, pg_temp', current_schema());
BEGIN
    EXECUTE format('ALTER FUNCTION render_schedule_notify() SET search_path = %s', path);
    EXECUTE format('ALTER FUNCTION render_schedule_notify_truncate() SET search_path = %s', path);
    EXECUTE format('ALTER FUNCTION renderqueue_event_key() SET search_path = %s', path);
    EXECUTE format('ALTER FUNCTION renderqueue_sign(text, text) SET search_path = %s', path);
    EXECUTE format('ALTER FUNCTION renderqueue_rotate_event_key() SET search_path = %s', path);
END
$do$;
