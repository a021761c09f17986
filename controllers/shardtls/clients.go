package shardtls

import (
	"bytes"
	"crypto/sha256"
	"net/http"
	"sync"

	rqclient "github.com/renderqueue/renderqueue/pkg/client"
)

// Clients are the HTTP clients the operator asks TLS shards with: one per server name and CA
// bundle (a client verifies one name). The zero value is ready to use; it is safe for
// concurrent use.
type Clients struct {
	mu      sync.Mutex
	clients map[string]*http.Client // by server name
	bundles map[string][32]byte     // the bundle each was built with
}

// Get returns the client for serverName verifying with bundle (rqclient.NewHTTPClient), building
// it when there is none or the bundle changed.
func (c *Clients) Get(serverName string, bundle []byte) (*http.Client, error) {
	sum := sha256.Sum256(bundle)
	c.mu.Lock()
	defer c.mu.Unlock()
	if hc := c.clients[serverName]; hc != nil && c.bundles[serverName] == sum {
		return hc, nil
	}
	hc, err := rqclient.NewHTTPClient(rqclient.TLSOptions{CAPEM: bytes.Clone(bundle), ServerName: serverName})
	if err != nil {
		return nil, err
	}
	if c.clients == nil {
		c.clients, c.bundles = map[string]*http.Client{}, map[string][32]byte{}
	}
	c.clients[serverName], c.bundles[serverName] = hc, sum
	return hc, nil
}

// Forget drops the client of serverName (its RenderQueue is gone).
func (c *Clients) Forget(serverName string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if hc := c.clients[serverName]; hc != nil {
		hc.CloseIdleConnections()
	}
	delete(c.clients, serverName)
	delete(c.bundles, serverName)
}
