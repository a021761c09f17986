-- A writer may stamp rev itself (issue 14: the commit path).
--
-- Until now every inserted and updated row ran render_schedule_set_rev(), a PL/pgSQL row trigger,
-- to take a fresh rev: about 5 µs of PostgreSQL CPU per completed row on a 2-core machine, a
-- sixth of a completion's cost. A writer that sets the fresh rev itself, in the statement
-- (SET rev = nextval('render_schedule_rev_seq')), now skips that trigger; every other write still
-- runs it. The trigger is skipped only when the new rev is one the sequence has handed out and is
-- above the row's old rev, so no writer can push a row's rev backwards or past the sequence (a
-- rev above the sequence would make every later, trigger-stamped write of the key look stale to
-- the keepers). Inserts, and updates that leave rev alone (every writer before this version, every
-- upsert), change a key, or set any other rev, run the trigger as before: it refuses key changes
-- and stamps nextval.
--
-- pg_sequence_last_value needs SELECT or USAGE on the sequence, which writers already need for
-- the trigger's nextval; it is NULL before the sequence's first value (coalesce: then no rev is
-- acceptable and the trigger runs). The regclass is resolved when the trigger is created, so the
-- condition does not depend on the writer's search_path.

DROP TRIGGER render_schedule_rev ON render_schedule;

CREATE TRIGGER render_schedule_rev_insert
    BEFORE INSERT ON render_schedule
    FOR EACH ROW EXECUTE FUNCTION render_schedule_set_rev();

CREATE TRIGGER render_schedule_rev_update
    BEFORE UPDATE ON render_schedule
    FOR EACH ROW
    WHEN (NEW.key IS DISTINCT FROM OLD.key
          OR NOT (NEW.rev > OLD.rev
                  AND NEW.rev <= coalesce(pg_sequence_last_value('render_schedule_rev_seq'::regclass), 0)))
    EXECUTE FUNCTION render_schedule_set_rev();
