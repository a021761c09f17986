// Package certs generates and checks the small private PKI renderqueue keeps for itself: a CA
// (ECDSA P-256, 10 years, replaced a year before its end and kept in the bundle beside its
// successor until it expires) and serving certificates it signs (ECDSA P-256, a year, replaced 30
// days before their end). The metrics API (pkg/metricsapi) serves one to the aggregator; the
// operator issues one per RenderQueue to its keeper shards (spec.tls).
//
// Everything here is pure: the time is a parameter, nothing is read or written but the returned
// values (the randomness of keys and serial numbers aside). Keeping the results — in Secrets, in
// status — is the callers'.
package certs
