package client

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/shardapi/wire"
)

// Peers is how a keeper shard asks the other shards of its queue for the handover of slots it
// took over (POST /v1/handover: the leases the giver granted on their rows, which travel with
// them; docs/design.md, "Leases across a handoff"). It implements keeper.PeerClient.
type Peers struct {
	// HTTP is the client the asks go through (with the shards' CA when they serve HTTPS).
	HTTP *http.Client
	// Token is the queue's API token.
	Token string
}

// Handover asks the shard at baseURL for the handover of req.Slots.
func (p *Peers) Handover(ctx context.Context, baseURL string, req shardapi.HandoverRequest) (shardapi.HandoverResponse, error) {
	var resp shardapi.HandoverResponse
	b, err := wire.Marshal(req)
	if err != nil {
		return resp, fmt.Errorf("encoding the handover request: %w", err)
	}
	if _, err := do(ctx, p.HTTP, http.MethodPost, strings.TrimRight(baseURL, "/")+"/v1/handover", p.Token, b, &resp); err != nil {
		return shardapi.HandoverResponse{}, err
	}
	return resp, nil
}
