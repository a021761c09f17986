-- The schedule table of ARCHITECTURE section 3, its revision sequence and its change events.
--
-- key         the canonical URL; COLLATE "C" so (key_hash, key) order is plain byte order, the
--             same everywhere and cheap to compare.
-- key_hash    the ownership hash, computed by the database: slot = (key_hash >> 54) + 512, which
--             equals Go's schedule.SlotOf (uint64(key_hash) ^ 1<<63) >> 54.
-- due_at      next render time; NULL = unscheduled. Must be finite when set.
-- cadence_ms  render interval in milliseconds (> 0). Milliseconds rather than interval: an interval
--             mixes months, days and microseconds and has no single length, a bigint does.
-- rev         a fresh value of render_schedule_rev_seq on every insert and update (trigger); a
--             delete's change event carries a fresh value too.
--
-- Only key (primary key) and (key_hash, key) are indexed. Neither changes when a render completes
-- (due_at, urgent, rev do), so with free space on every page (fillfactor 80) completions are HOT
-- updates. There is deliberately no index on due_at: nothing seeks by it.

CREATE SEQUENCE render_schedule_rev_seq AS bigint;

CREATE TABLE render_schedule (
    key        text COLLATE "C" NOT NULL,
    key_hash   bigint GENERATED ALWAYS AS (hashtextextended(key, 0)) STORED,
    due_at     timestamptz NULL,
    cadence_ms bigint NOT NULL,
    route      text NOT NULL DEFAULT '',
    source     text NOT NULL DEFAULT 'discovered',
    urgent     boolean NOT NULL DEFAULT false,
    rev        bigint NOT NULL DEFAULT 0,
    CONSTRAINT render_schedule_pkey PRIMARY KEY (key),
    CONSTRAINT render_schedule_key_length CHECK (octet_length(key) BETWEEN 1 AND 2048),
    CONSTRAINT render_schedule_cadence_positive CHECK (cadence_ms > 0),
    CONSTRAINT render_schedule_due_finite CHECK (due_at IS NULL OR isfinite(due_at)),
    CONSTRAINT render_schedule_route_length CHECK (octet_length(route) <= 256),
    CONSTRAINT render_schedule_source_known CHECK (source IN ('submitted', 'discovered'))
) WITH (fillfactor = 80);

CREATE INDEX render_schedule_hash_key ON render_schedule (key_hash, key);

-- Every inserted or updated row gets a fresh rev. Keys are identities: changing one would make
-- the old key vanish without a delete event, so it is refused (delete and insert instead).
CREATE FUNCTION render_schedule_set_rev() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.key IS DISTINCT FROM OLD.key THEN
        RAISE EXCEPTION 'render_schedule: key % cannot be changed to %; delete and insert instead', OLD.key, NEW.key
            USING ERRCODE = 'check_violation';
    END IF;
    NEW.rev := nextval('render_schedule_rev_seq');
    RETURN NEW;
END
$fn$;

CREATE TRIGGER render_schedule_rev
    BEFORE INSERT OR UPDATE ON render_schedule
    FOR EACH ROW EXECUTE FUNCTION render_schedule_set_rev();

-- Change events: one statement-level trigger per operation (transition tables allow only one
-- event per trigger), all running this function with the changed rows as "changed".
--
-- Each slot's rows go to channel rq_slot_<slot> as payloads of the form
--   "1" entry*    entry = rev "," key_hash "," due_unix_micros_or_empty "," cadence_ms ","
--                         flags "," octet_length(key) ":" key octet_length(route) ":" route
-- flags: 1 = submitted, 2 = urgent, 4 = deleted. Keys and routes are length-prefixed, so they
-- need no escaping. A slot's rows are cut into payloads when the bytes before an entry pass a
-- multiple of 5000; an entry is at most ~2.4 kB (key <= 2048, route <= 256 bytes), so every
-- payload stays under 7500 bytes, below PostgreSQL's 8000-byte limit.
CREATE FUNCTION render_schedule_notify() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    deleted boolean := TG_OP = 'DELETE';
BEGIN
    PERFORM pg_notify('rq_slot_' || g.slot, '1' || string_agg(g.entry, '' ORDER BY g.n))
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
    GROUP BY g.slot, g.chunk;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER render_schedule_notify_insert
    AFTER INSERT ON render_schedule REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION render_schedule_notify();

CREATE TRIGGER render_schedule_notify_update
    AFTER UPDATE ON render_schedule REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION render_schedule_notify();

CREATE TRIGGER render_schedule_notify_delete
    AFTER DELETE ON render_schedule REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION render_schedule_notify();

-- TRUNCATE removes rows without row events: tell every slot's listeners that continuity is lost
-- (payload "T"), so they treat it as a gap and walk again.
CREATE FUNCTION render_schedule_notify_truncate() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('rq_slot_' || s, 'T') FROM generate_series(0, 1023) AS s;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER render_schedule_notify_truncate
    AFTER TRUNCATE ON render_schedule
    FOR EACH STATEMENT EXECUTE FUNCTION render_schedule_notify_truncate();
