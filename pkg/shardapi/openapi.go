package shardapi

import _ "embed" // the OpenAPI document

// OpenAPI is the OpenAPI 3 document of the shard API (openapi.yaml in this package), for
// generating clients in other languages. A test serves the real handlers and validates recorded
// requests and replies against it, so it describes what the shards do.
//
//go:embed openapi.yaml
var OpenAPI []byte
