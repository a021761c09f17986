// Package httpserve is the HTTP plumbing of a keeper shard's API (package keeper serves the
// endpoints): the strict JSON decoding of request bodies with their size and item limits
// (Decode, MaxRequestBytes; complete and release bodies of up to MaxFastBodyBytes by package
// shardapi/wire when they are plain JSON), the JSON replies (WriteJSON, the hot ones by wire),
// the buffers of those hot bodies and replies that a handler reuses (Codec), the server's
// timeouts and the admission of the mutating endpoints' requests — claims in a room of their own,
// the other requests by count and body bytes, every body under a deadline of its own (Limits,
// NewServer, Admission) —, the bearer token (Bearer), a request's leaseSeconds
// (LeaseSeconds, MaxLease), the lease token's wire form (FormatLease, ParseLease), and the TLS
// certificate files a shard may serve HTTPS with, reloaded when they change (CertFiles).
package httpserve
