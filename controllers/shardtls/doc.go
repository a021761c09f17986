// Package shardtls is the operator's side of spec.tls: for OperatorIssued, the shard CA it keeps in a
// Secret of its own namespace (CAStore, the only I/O here), and, as pure functions of the
// RenderQueue, its status and the CA, when a RenderQueue's shards need a new serving certificate
// (Decide), what it is (Issue) and which status.tls to keep while shards that serve TLS remain
// (StatusToKeep); and the HTTP clients that verify TLS shards, one per server name (Clients).
//
// The operator may create and update Secrets but never read them outside its own namespace, so
// it does not look at the certificate it gave the shards: it records what it issued in
// status.tls (serial, end, the CA's fingerprint) and decides from that record alone. A missing
// record (a new RenderQueue, or a status lost) means "issue": the Secret is created, or, when it
// exists, overwritten with an unconditional update.
//
// For Provided, someone else keeps the certificate in a Secret the RenderQueue names, which the
// operator is granted to read; CheckProvided checks what it holds as a client of the shards
// would, and says what is wrong with it.
package shardtls
