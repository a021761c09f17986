// Package changes is the change-event subscription of the PostgreSQL schedule store: the events
// the schema's triggers send with pg_notify when rows of render_schedule change, received,
// verified and queued for a keeper (store.Subscription).
//
// A [Subscription] holds one dedicated connection (application_name [ListenerApplicationName])
// that LISTENs on exactly the subscribed slots' channels, rq_slot_<slot>. Every payload is signed
// by the triggers with HMAC-SHA-256 under a key the subscription reads with
// renderqueue_event_key() (pkg/store/postgres/migrations/0002_signed_events.sql); a payload that
// is unsigned, badly signed, stale, replayed or malformed is dropped and signalled as a gap, then
// resumed (docs/security.md, "Database"). The bodies' entries (format 1,
// pkg/store/postgres/migrations/0001_render_schedule.sql) become store.Events.
//
// When the connection is lost the subscription signals a gap at once, reconnects with backoff
// and signals resumed once LISTEN is active again; a TRUNCATE of the table and an overflow of the
// bounded queue (store.EventQueue) are gaps too. An idle connection is checked with a round trip
// every Config.HealthInterval.
//
// pkg/store/postgres's Store.Subscribe opens subscriptions with its options and closes them with
// the store; [Subscribe] is the same without a store.
package changes
