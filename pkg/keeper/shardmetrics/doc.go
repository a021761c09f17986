// Package shardmetrics holds a keeper shard's Prometheus metrics, all named
// renderqueue_keeper_*: the event metrics the shard records as it walks, follows change events,
// hands out and completes rows (Metrics), and the state gauges computed from its status at scrape
// time (StatusCollector). Package keeper records into them; it does not depend on them otherwise.
package shardmetrics
