package controllers

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// fakeShard stands in for a keeper shard's GET /v1/status. It follows its RenderQueue's
// status.membership like a real keeper (reading the object on every request), and reports what
// the test sets.
type fakeShard struct {
	name, namespace, queue string
	reader                 client.Reader
	srv                    *httptest.Server

	mu sync.Mutex
	// due is reported on the shard's first owned slot.
	due      int
	exact    bool
	complete bool
	status   string
	edge     *time.Time // absolute, fixed between "walks"
	partial  bool
	unread   int
	walked   bool
	// autoPrepare reports preparedEpoch = epoch as soon as the shard adopts an assignment;
	// otherwise preparedEpoch is what the test sets.
	autoPrepare   bool
	preparedEpoch int64
	// failWith, when non-zero, is the HTTP status of every reply; badJSON sends garbage;
	// wrongName reports another shard's name.
	failWith  int
	badJSON   bool
	wrongName bool
	walkedAt  time.Time
	// hang answers nothing until the request is cancelled (a shard on a node that is gone:
	// every poll runs into its timeout).
	hang bool
	// err is the status's error field (the keeper's own: a database it cannot reach, say).
	err string
	// classes is the status's classes.
	classes []shardapi.Class
	// coming is the status's coming counts.
	coming shardapi.Coming
	// objectives are the status's objective counters.
	objectives []shardapi.ObjectiveCount
}

func newFakeShard(reader client.Reader, namespace, queue, name string) *fakeShard {
	f := newFakeShardState(reader, namespace, queue, name)
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	return f
}

// newFakeShardState is a fakeShard without a server of its own: its serve method answers for it
// (under a path prefix stripped first, when many fakes share one server).
func newFakeShardState(reader client.Reader, namespace, queue, name string) *fakeShard {
	edge := time.Now().Add(23 * time.Hour).Truncate(time.Second)
	return &fakeShard{
		name: name, namespace: namespace, queue: queue, reader: reader,
		due: 10, exact: true, complete: true, status: shardapi.StatusQueued, edge: &edge,
		walked: true, autoPrepare: true, walkedAt: time.Now().Add(-time.Minute).Truncate(time.Second),
	}
}

// set changes the fake's state under its lock.
func (f *fakeShard) set(change func(f *fakeShard)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f)
}

func (f *fakeShard) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/status" {
		http.NotFound(w, r)
		return
	}
	var rq rqv1.RenderQueue
	err := f.reader.Get(r.Context(), types.NamespacedName{Namespace: f.namespace, Name: f.queue}, &rq)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	owned, incoming := "", ""
	for _, s := range rq.Status.Membership.Assignment {
		if s.Shard == f.name {
			owned = s.Slots
		}
	}
	for _, s := range rq.Status.Membership.Incoming {
		if s.Shard == f.name {
			incoming = s.Slots
		}
	}
	epoch := rq.Status.Membership.Epoch

	f.mu.Lock()
	if f.hang {
		f.mu.Unlock()
		<-r.Context().Done()
		return
	}
	defer f.mu.Unlock()
	if f.failWith != 0 {
		http.Error(w, "shard failure injected by the test", f.failWith)
		return
	}
	if f.badJSON {
		_, _ = w.Write([]byte(`{"shard": "` + f.name + `", "due": "many"`))
		return
	}
	now := time.Now()
	st := shardapi.Status{
		Shard: f.name, AsOf: now, Status: f.status, Complete: f.complete, Exact: f.exact,
		Window: 86400, VerifyInterval: 3600, Edge: f.edge,
		Membership: shardapi.Membership{Epoch: epoch, Owned: owned, Incoming: incoming, PreparedEpoch: f.preparedEpoch},
		Rows:       shardapi.Rows{Held: 1000, OwnedNotHeld: 5000},
		DuePerSlot: map[string]int{},
		Error:      f.err,
		Classes:    f.classes,
		Coming:     f.coming,
		Objectives: slices.Clone(f.objectives),
	}
	if f.wrongName {
		st.Shard = f.name + "-impostor"
	}
	if f.autoPrepare {
		st.Membership.PreparedEpoch = epoch
	}
	if f.edge != nil {
		ahead := f.edge.Sub(now).Seconds()
		st.EdgeAheadSeconds = &ahead
	}
	if set, err := schedule.ParseSlots(owned); err == nil && !set.IsEmpty() {
		st.Due = f.due
		st.DuePerSlot[strconv.Itoa(set.Slots()[0])] = f.due
	}
	if f.walked {
		finished := f.walkedAt
		st.LastWalk = &shardapi.Walk{StartedAt: f.walkedAt.Add(-10 * time.Second), FinishedAt: &finished,
			Partial: f.partial, UnreadSegments: f.unread, Scanned: 6000}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(st)
}
