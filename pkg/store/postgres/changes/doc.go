// Package changes is the change-event subscription of the PostgreSQL schedule store: the events
// the schema's triggers send with pg_notify when rows of render_schedule change, received,
// verified and queued for a keeper (store.Subscription).
//
// A [Subscription] holds one dedicated connection (application_name [ListenerApplicationName])
// that LISTENs on the channels of the subscribed slots' groups of [GroupSlots] adjacent slots,
// [GroupChannel] rq_slots_<slot/16> (pkg/store/postgres/migrations/0004_slot_group_channels.sql),
// and queues only the subscribed slots' events: a slot added to a group already listened to
// delivers what is read from the moment SetSlots applies it, as a LISTEN on a channel of its own
// would. Before schema version 4 events go to one channel per slot, [SlotChannel] rq_slot_<slot>:
// the subscription reads the schema's version each time it connects and listens where the events
// go; it also always listens on [SchemaChannel], where the migration to version 4 sends a signed
// payload that makes it reconnect (a gap) and read the version again. Every payload is signed
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
