package keeper

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
)

// A keeper that dies (docs/design.md, "A keeper that dies").
//
// A keeper's leases live in its memory; the process that takes its slots over next (the shard's
// container restarted, its Pod replaced) must hand out none of the rows the dead one may have
// leased until those leases have ended. It learns how long that is, at most, from two records:
//
//   - the lease horizon in a Pod-local state file (Options.StateFile, on the Pod's emptyDir):
//     a time every lease the process granted, extended or took over ends by, written before a
//     claim or an extension that goes past it is answered (a quarter of the longest lease
//     further each time, so it is written rarely). It survives the process, not the Pod;
//   - the shard's session in the store (store.Sessions): which process ran it, in which Pod, and
//     whether it ended cleanly — a keeper stopped by SIGTERM stops handing rows out, waits for its
//     leases to end (Drain), and records when the last one still running ends.
//
// At the start of a process (beginSession), the bound on its predecessor's leases is: none when
// the shard never ran before; the predecessor's recorded end of leases when it ended cleanly; the
// state file's horizon when it died in this Pod; and, when it died in another Pod (lost with its
// node, force-deleted) or the store keeps no sessions, now + the longest lease, since the dead one
// may have leased any row until it died. Until that bound every owned slot is fenced
// (core.Core.Fence): its rows are still held, due and counted, and handed to nobody.

// stateFile is the content of Options.StateFile.
type stateFile struct {
	// Pod identifies the Pod (the file's emptyDir): random, made by its first keeper process.
	Pod string `json:"pod"`
	// Until is when every lease the Pod's keeper processes granted has ended, at the latest.
	Until time.Time `json:"until"`
}

// randomID returns 16 random bytes in hex.
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// readState reads the state file (found false when there is none or no file is configured).
func (s *Shard) readState() (st stateFile, found bool, err error) {
	if s.stateFile == "" {
		return stateFile{}, false, nil
	}
	b, err := os.ReadFile(s.stateFile)
	if errors.Is(err, os.ErrNotExist) {
		return stateFile{}, false, nil
	}
	if err != nil {
		return stateFile{}, false, fmt.Errorf("reading the keeper's state file: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Pod == "" {
		return stateFile{}, false, fmt.Errorf("the keeper's state file %s does not parse (%v): its leases are unknown", s.stateFile, err)
	}
	return st, true, nil
}

// writeState replaces the state file (write to a temporary file, rename).
func (s *Shard) writeState(st stateFile) error {
	if s.stateFile == "" {
		return nil
	}
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encoding the keeper's state: %w", err)
	}
	tmp := s.stateFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing the keeper's state file: %w", err)
	}
	if err := os.Rename(tmp, s.stateFile); err != nil {
		return fmt.Errorf("writing the keeper's state file: %w", err)
	}
	return nil
}

// coverLeases makes sure the state file's horizon is at or after until: every lease the process
// has out ends by it. It writes the file (a quarter of the longest lease past until, so that the
// next claims need not) when it is not; without a state file it does nothing.
func (s *Shard) coverLeases(until time.Time) error {
	if s.stateFile == "" || until.IsZero() {
		return nil
	}
	s.horizonMu.Lock()
	defer s.horizonMu.Unlock()
	if !until.After(s.horizon) {
		return nil
	}
	s.mu.Lock()
	slack := max(s.settings.maxLease()/4, time.Second)
	s.mu.Unlock()
	next := until.Add(slack)
	if err := s.writeState(stateFile{Pod: s.pod, Until: next}); err != nil {
		return err
	}
	s.horizon = next
	return nil
}

// sessionRetry bounds the pause between attempts to begin the session while the store fails.
const sessionRetry = 5 * time.Second

// beginSession learns the bound on the leases of the shard's previous process (see above),
// records this process's session, writes the state file and fences the owned slots until the
// bound. It waits (adopting settings meanwhile) while the store cannot be asked; it returns
// only ctx's error.
func (s *Shard) beginSession(ctx context.Context, updates <-chan Settings) error {
	file, inPod, ferr := s.readState()
	if ferr != nil {
		s.log.Error(ferr, "The keeper's state file is unreadable; the leases of an earlier process in this Pod are unknown", "shard", s.name)
	}
	pod := file.Pod
	if !inPod {
		pod = randomID()
	}
	s.horizonMu.Lock()
	s.pod = pod
	s.horizonMu.Unlock()
	start := s.clock()
	s.mu.Lock()
	maxLease := s.settings.maxLease()
	s.mu.Unlock()
	unknown := start.Add(maxLease) // any lease of a process that died before now has ended by then
	var until time.Time
	why := ""
	ss, ok := s.st.(store.Sessions)
	for {
		if !ok {
			until, why = unknown, "this store keeps no keeper sessions"
			break
		}
		prev, found, err := ss.BeginSession(ctx, store.Session{Shard: s.name, Instance: s.instance, Pod: pod})
		if err == nil {
			switch {
			case !found:
				// the shard's first process, unless this Pod ran one before the store kept sessions
				until, why = file.Until, "an earlier process in this Pod"
			case !prev.EndedAt.IsZero():
				until, why = prev.LeasesUntil, "the earlier process ended cleanly, its last lease ending then"
				if inPod {
					until = latest(until, file.Until)
				}
			case inPod && prev.Pod == file.Pod && ferr == nil:
				until, why = file.Until, "an earlier process in this Pod died; its state file says its leases end by then"
			default:
				until, why = unknown, fmt.Sprintf("an earlier process (started %s, in another Pod) did not end cleanly", prev.StartedAt.UTC().Format(time.RFC3339))
			}
			break
		}
		if errors.Is(err, store.ErrNoSessions) {
			until, why = unknown, "the store keeps no keeper sessions"
			if inPod && ferr == nil {
				until, why = file.Until, "an earlier process in this Pod (the store keeps no keeper sessions)"
			}
			s.log.Error(err, "Cannot learn whether an earlier process of the shard may have leases out; holding its rows back", "shard", s.name)
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.setErr(err)
		s.log.Error(err, "Cannot begin the keeper session; retrying", "shard", s.name)
		if !s.sleepAdopting(ctx, updates, sessionRetry) {
			return ctx.Err()
		}
	}
	if ferr != nil && until.Before(unknown) {
		until, why = unknown, "the state file of this Pod is unreadable"
	}
	s.horizonMu.Lock()
	if err := s.writeState(stateFile{Pod: pod, Until: latest(until, file.Until)}); err != nil {
		s.log.Error(err, "Cannot write the keeper's state file; a restart in this Pod will hold its rows back for the longest lease", "shard", s.name)
	}
	s.horizon = latest(until, file.Until)
	s.horizonMu.Unlock()

	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	if !until.After(now) {
		s.log.Info("Keeper session begun; no earlier process may have leases out", "shard", s.name, "instance", s.instance)
		return nil
	}
	s.inherited = until
	var slots []int
	for _, sl := range s.settings.Owned.Slots() {
		if _, awaited := s.awaiting[sl]; !awaited {
			slots = append(slots, sl)
		}
	}
	s.core.Fence(now, slots, until)
	reason := "the leases of an earlier keeper process of " + s.name + " are not known: they have ended by then"
	for _, sl := range slots {
		s.fenceWhy[sl] = reason
	}
	s.log.Info("Keeper session begun; holding the owned rows back until the leases an earlier process may have granted have ended",
		"shard", s.name, "instance", s.instance, "until", until, "why", why, "slots", schedule.FormatSlots(setOf(slots)))
	return nil
}

// ErrDraining is returned by Claim while the shard drains before it stops (Drain).
var ErrDraining = errors.New("the shard is stopping: it hands out no more rows; claim from another shard")

// Drain prepares the process's end: the shard hands out no more rows (claims get ErrDraining),
// and Drain waits until every lease it has out has ended (completed, released, expired) and the
// shards that took its slots over have asked for their leases, or until ctx ends. Then it
// records a clean end of its session with when the last lease still running ends, so that the
// next process of the shard holds back no more than that (see beginSession). Completions,
// releases and extensions are served meanwhile (an extension no further than the longest lease).
func (s *Shard) Drain(ctx context.Context) {
	s.draining.Store(true)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
wait:
	for {
		until, pending := s.leasesOut()
		if !pending {
			break
		}
		select {
		case <-ctx.Done():
			s.log.Info("Stopping with leases out; the next process of the shard holds its rows back until they end", "shard", s.name, "until", until)
			break wait
		case <-t.C:
		}
	}
	until, _ := s.leasesOut()
	s.mu.Lock()
	st := s.st
	s.mu.Unlock()
	s.horizonMu.Lock()
	begun := s.pod != ""
	s.horizonMu.Unlock()
	ss, ok := st.(store.Sessions)
	if !ok || !begun {
		return
	}
	ectx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ended, err := ss.EndSession(ectx, s.name, s.instance, until); err != nil || !ended {
		s.log.Error(err, "Cannot record the keeper's clean end; its next process will hold its rows back for the longest lease", "shard", s.name, "latest", ended)
		return
	}
	s.log.Info("Keeper session ended cleanly", "shard", s.name, "leasesUntil", until)
}

// leasesOut returns when the last lease the process has out ends (its own, those that left with
// slots not yet asked for, and its predecessor's it holds rows back for), and whether any such
// lease still runs.
func (s *Shard) leasesOut() (until time.Time, pending bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	until = s.core.LeasesUntil(now)
	pending = until.After(now)
	for _, rec := range s.out {
		if rec.fetched {
			continue
		}
		for _, l := range rec.leases {
			if l.Expires.After(now) {
				until, pending = latest(until, l.Expires), true
			}
		}
	}
	if s.inherited.After(now) {
		until = latest(until, s.inherited)
	}
	if !until.After(now) {
		until = time.Time{}
	}
	return until, pending
}

// StateFileIn is the path of the keeper's state file in dir (the Pod's emptyDir).
func StateFileIn(dir string) string { return filepath.Join(dir, "renderqueue-keeper-state.json") }
