// Package view is what the console shows, computed from what it read: pure functions, no I/O,
// the clock passed in.
//
//   - [Summarize] turns a RenderQueue into a [QueueSummary] (a row of the queues page);
//   - [Detail] turns a RenderQueue, each shard's /v1/status ([ShardReport]) and the due history
//     ([Sample]) into a [QueueDetail] (the one-queue page and its JSON);
//   - [NewQueueView] adds the charts: each a [Chart], plain SVG geometry (bars, lines, dots,
//     labels) that one template draws;
//   - [TemplateFuncs] are the formatting helpers of the console's templates.
//
// Package console reads the RenderQueues and asks the shards, samples the due history, serves
// the pages and JSON built from these views, and guards access to them.
package view
