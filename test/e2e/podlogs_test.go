//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/node"
)

// podLogKeeper copies every container's log, as the kubelet writes it, into a directory that
// outlives the run (RENDERQUEUE_E2E_LOG_DIR): the kubelet deletes a Pod's logs with the Pod, and
// a chaos run deletes shard Pods at every scale-down, so the logs of the shards a failure
// concerns are often gone by the time the test fails. hack/soak.sh sets it.
type podLogKeeper struct {
	dir   string
	files func() []node.LogFile
	// copied is how many bytes of each source log were copied
	copied map[string]int64
	stop   context.CancelFunc
	wg     sync.WaitGroup
}

// keepPodLogs starts copying the node's container logs into dir every interval; Stop copies
// them once more and ends it.
func keepPodLogs(dir string, files func() []node.LogFile, interval time.Duration) (*podLogKeeper, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("keeping the Pods' logs: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	k := &podLogKeeper{dir: dir, files: files, copied: map[string]int64{}, stop: cancel}
	k.wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				k.copyAll()
			}
		}
	})
	return k, nil
}

// Stop ends the copying after a last copy.
func (k *podLogKeeper) Stop() {
	k.stop()
	k.wg.Wait()
	k.copyAll()
}

// copyAll appends what each log gained since the last copy to its copy,
// <dir>/<namespace>_<pod>_<uid>/<container>/<n>.log as the kubelet names them.
func (k *podLogKeeper) copyAll() {
	for _, f := range k.files() {
		container := filepath.Dir(f.Path)
		rel := filepath.Join(filepath.Base(filepath.Dir(container)), filepath.Base(container), filepath.Base(f.Path))
		_ = k.copyOne(f.Path, filepath.Join(k.dir, rel))
	}
}

func (k *podLogKeeper) copyOne(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	off := k.copied[src]
	if st.Size() < off {
		off = 0 // rotated: the new file from its start
	}
	if st.Size() == off {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer func() { _ = out.Close() }()
	if _, err := in.Seek(off, io.SeekStart); err != nil {
		return err
	}
	n, err := io.Copy(out, in)
	k.copied[src] = off + n
	return err
}
