package podconfig

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// volFile is a file of a secret, configMap, downwardAPI or projected volume.
type volFile struct {
	data []byte
	mode os.FileMode
}

// volumeDir is where a volume of the Pod lives on this machine.
func (pc *Pod) volumeDir(name string) string { return filepath.Join(pc.dir, "volumes", name) }

// volumeSource is the directory (or file, for a hostPath) a volume is mounted from.
func (pc *Pod) volumeSource(v corev1.Volume) (string, error) {
	if v.HostPath != nil {
		return path.Clean(v.HostPath.Path), nil
	}
	if volumeKind(v) == "" {
		return "", fmt.Errorf("volume %q: %w", v.Name, errUnsupportedVolume(v))
	}
	return pc.volumeDir(v.Name), nil
}

// volumeKind names the supported kinds ("" for the others).
func volumeKind(v corev1.Volume) string {
	switch {
	case v.EmptyDir != nil:
		return "emptyDir"
	case v.HostPath != nil:
		return "hostPath"
	case v.Secret != nil:
		return "secret"
	case v.ConfigMap != nil:
		return "configMap"
	case v.DownwardAPI != nil:
		return "downwardAPI"
	case v.Projected != nil:
		return "projected"
	}
	return ""
}

func errUnsupportedVolume(v corev1.Volume) error {
	b, _ := json.Marshal(v.VolumeSource)
	return fmt.Errorf("this volume type is not supported by the local pod runner (emptyDir, hostPath, secret, configMap, downwardAPI and projected are): %s", b)
}

// SyncVolumes brings every volume of pod (its latest version), whose IP is podIP, up to date:
// creates emptyDirs, checks hostPaths, writes secret, configMap, downwardAPI and projected volumes
// (atomically, only when their content changed) and refreshes ServiceAccount tokens that reached
// 80% of their lifetime. The error lists every volume that is not ready (kubelet's FailedMount).
func (pc *Pod) SyncVolumes(ctx context.Context, pod *corev1.Pod, podIP string) error {
	var errs []error
	for _, v := range pod.Spec.Volumes {
		if err := pc.syncVolume(ctx, pod, podIP, v); err != nil {
			errs = append(errs, fmt.Errorf("volume %q: %w", v.Name, err))
		}
	}
	return errors.Join(errs...)
}

func (pc *Pod) syncVolume(ctx context.Context, pod *corev1.Pod, podIP string, v corev1.Volume) error {
	var fsGroup *int64
	if pod.Spec.SecurityContext != nil {
		fsGroup = pod.Spec.SecurityContext.FSGroup
	}
	dir := pc.volumeDir(v.Name)
	switch {
	case v.EmptyDir != nil:
		if _, err := os.Stat(dir); err == nil {
			return nil // kept across container restarts
		}
		if v.EmptyDir.Medium != "" || v.EmptyDir.SizeLimit != nil {
			pc.ignored("emptyDir:"+v.Name, "emptyDir %s: medium %q / sizeLimit not honoured (a directory on this machine's disk)", v.Name, v.EmptyDir.Medium)
		}
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return err
		}
		mode := os.FileMode(0o777)
		if fsGroup != nil {
			if err := os.Chown(dir, -1, int(*fsGroup)); err != nil {
				return err
			}
			mode |= os.ModeSetgid
		}
		return os.Chmod(dir, mode)
	case v.HostPath != nil:
		return checkHostPath(v.HostPath)
	}
	var files map[string]volFile
	var err error
	switch {
	case v.Secret != nil:
		s := v.Secret
		files = map[string]volFile{}
		err = pc.keyFiles(files, "secret", s.SecretName, s.Items, modeOr(s.DefaultMode), s.Optional != nil && *s.Optional, pc.secretData)
	case v.ConfigMap != nil:
		c := v.ConfigMap
		files = map[string]volFile{}
		err = pc.keyFiles(files, "configmap", c.Name, c.Items, modeOr(c.DefaultMode), c.Optional != nil && *c.Optional, pc.configMapData)
	case v.DownwardAPI != nil:
		files = map[string]volFile{}
		err = pc.downwardFiles(files, pod, podIP, v.DownwardAPI.Items, modeOr(v.DownwardAPI.DefaultMode))
	case v.Projected != nil:
		files, err = pc.projectedFiles(ctx, pod, podIP, v)
	default:
		return errUnsupportedVolume(v)
	}
	if err != nil {
		return err
	}
	return writeAtomic(dir, files, fsGroup)
}

func modeOr(m *int32) os.FileMode {
	if m == nil {
		return 0o644
	}
	return os.FileMode(*m) & os.ModePerm
}

// keyFiles adds the keys of a Secret or ConfigMap (all, or items) as files.
func (pc *Pod) keyFiles(files map[string]volFile, what, name string, items []corev1.KeyToPath, mode os.FileMode, optional bool,
	read func(string) (map[string][]byte, error)) error {
	data, err := read(name)
	if apierrors.IsNotFound(err) {
		if optional {
			return nil
		}
		return fmt.Errorf("%s %q not found", what, name)
	}
	if err != nil {
		return fmt.Errorf("reading %s %s/%s: %w", what, pc.namespace, name, err)
	}
	if len(items) == 0 {
		for k, d := range data {
			files[k] = volFile{data: d, mode: mode}
		}
		return nil
	}
	for _, it := range items {
		d, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return fmt.Errorf("%s %s references non-existent key: %s", what, name, it.Key)
		}
		m := mode
		if it.Mode != nil {
			m = os.FileMode(*it.Mode) & os.ModePerm
		}
		files[it.Path] = volFile{data: d, mode: m}
	}
	return nil
}

// downwardFiles adds downward API items (metadata fields; resourceFieldRef is not honoured).
func (pc *Pod) downwardFiles(files map[string]volFile, pod *corev1.Pod, podIP string, items []corev1.DownwardAPIVolumeFile, mode os.FileMode) error {
	for _, it := range items {
		m := mode
		if it.Mode != nil {
			m = os.FileMode(*it.Mode) & os.ModePerm
		}
		switch {
		case it.FieldRef != nil:
			v, err := podFieldValue(pod, it.FieldRef.FieldPath, podIP)
			if err != nil {
				return err
			}
			files[it.Path] = volFile{data: []byte(v), mode: m}
		case it.ResourceFieldRef != nil:
			pc.ignored("downward-resource:"+it.Path, "downwardAPI item %s: resourceFieldRef not honoured (no resource accounting): file not written", it.Path)
		}
	}
	return nil
}

// projectedFiles gathers the sources of a projected volume.
func (pc *Pod) projectedFiles(ctx context.Context, pod *corev1.Pod, podIP string, v corev1.Volume) (map[string]volFile, error) {
	p := v.Projected
	mode := modeOr(p.DefaultMode)
	files := map[string]volFile{}
	for i, src := range p.Sources {
		var err error
		switch {
		case src.Secret != nil:
			s := src.Secret
			err = pc.keyFiles(files, "secret", s.Name, s.Items, mode, s.Optional != nil && *s.Optional, pc.secretData)
		case src.ConfigMap != nil:
			c := src.ConfigMap
			err = pc.keyFiles(files, "configmap", c.Name, c.Items, mode, c.Optional != nil && *c.Optional, pc.configMapData)
		case src.DownwardAPI != nil:
			err = pc.downwardFiles(files, pod, podIP, src.DownwardAPI.Items, mode)
		case src.ServiceAccountToken != nil:
			var tok string
			tok, err = pc.serviceAccountToken(ctx, pod, fmt.Sprintf("%s/%d", v.Name, i), src.ServiceAccountToken)
			if err == nil {
				files[src.ServiceAccountToken.Path] = volFile{data: []byte(tok), mode: mode}
			}
		default:
			err = errors.New("a projected source other than secret, configMap, downwardAPI and serviceAccountToken is not supported by the local pod runner")
		}
		if err != nil {
			return nil, err
		}
	}
	return files, nil
}

// projectedToken is a ServiceAccount token of a projected volume.
type projectedToken struct {
	token           string
	issued, expires time.Time
}

// tokenNeedsRefresh is kubelet's rule: a token is replaced once 80% of its lifetime has passed,
// or when it is older than 24 hours.
func tokenNeedsRefresh(issued, expires, now time.Time) bool {
	ttl := expires.Sub(issued)
	return !now.Before(issued.Add(ttl*8/10)) || now.Sub(issued) > 24*time.Hour
}

// serviceAccountToken returns the token of a serviceAccountToken source: a TokenRequest for the
// Pod's ServiceAccount with the source's audience and expirationSeconds, bound to the Pod,
// requested again when it needs a refresh.
func (pc *Pod) serviceAccountToken(ctx context.Context, pod *corev1.Pod, key string, src *corev1.ServiceAccountTokenProjection) (string, error) {
	pc.mu.Lock()
	t := pc.tokens[key]
	pc.mu.Unlock()
	now := time.Now()
	if t != nil && !tokenNeedsRefresh(t.issued, t.expires, now) {
		return t.token, nil
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	exp := int64(3600)
	if src.ExpirationSeconds != nil {
		exp = *src.ExpirationSeconds
	}
	spec := authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &exp,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}
	if src.Audience != "" {
		spec.Audiences = []string{src.Audience}
	}
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	tr, err := pc.src.Client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(rctx, sa, &authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token of ServiceAccount %s/%s: %w", pod.Namespace, sa, err)
	}
	nt := &projectedToken{token: tr.Status.Token, issued: now, expires: tr.Status.ExpirationTimestamp.Time}
	pc.mu.Lock()
	pc.tokens[key] = nt
	pc.mu.Unlock()
	if t != nil {
		pc.logf("refreshed the ServiceAccount token of %s (expires %s)", key, nt.expires.Format(time.RFC3339))
	}
	return nt.token, nil
}

// checkHostPath applies a hostPath volume's type.
func checkHostPath(hp *corev1.HostPathVolumeSource) error {
	p := path.Clean(hp.Path)
	typ := corev1.HostPathUnset
	if hp.Type != nil {
		typ = *hp.Type
	}
	fi, err := os.Stat(p)
	switch typ {
	case corev1.HostPathUnset:
		return nil
	case corev1.HostPathDirectoryOrCreate:
		if os.IsNotExist(err) {
			return os.MkdirAll(p, 0o755)
		}
		if err == nil && !fi.IsDir() {
			return fmt.Errorf("hostPath type check failed: %s is not a directory", p)
		}
		return err
	case corev1.HostPathFileOrCreate:
		if os.IsNotExist(err) {
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			return f.Close()
		}
		if err == nil && !fi.Mode().IsRegular() {
			return fmt.Errorf("hostPath type check failed: %s is not a file", p)
		}
		return err
	}
	if err != nil {
		return fmt.Errorf("hostPath type check failed: %s does not exist", p)
	}
	ok := map[corev1.HostPathType]bool{
		corev1.HostPathDirectory: fi.IsDir(),
		corev1.HostPathFile:      fi.Mode().IsRegular(),
		corev1.HostPathSocket:    fi.Mode()&os.ModeSocket != 0,
		corev1.HostPathCharDev:   fi.Mode()&os.ModeCharDevice != 0,
		corev1.HostPathBlockDev:  fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0,
	}
	if good, known := ok[typ]; !known || !good {
		return fmt.Errorf("hostPath type check failed: %s is not a %s", p, typ)
	}
	return nil
}

// isFile reports whether p is a regular file (or anything but a directory).
func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir()
}

// prepareSubPath makes sure a subPath exists (a directory is created in an emptyDir or hostPath
// volume, as kubelet does) and reports whether it is a file.
func prepareSubPath(p string, v corev1.Volume) (file bool, err error) {
	fi, err := os.Stat(p)
	if os.IsNotExist(err) && (v.EmptyDir != nil || v.HostPath != nil) {
		return false, os.MkdirAll(p, 0o755)
	}
	if err != nil {
		return false, err
	}
	return !fi.IsDir(), nil
}

// writeAtomic makes dir hold exactly files, laid out as kubelet's atomic writer does: the files
// in a timestamped directory ..<ts>, the symlink ..data pointing at it (replaced by a rename, so
// a reader sees the old or the new set, never a mix) and a symlink per top-level name into
// ..data. Nothing is written when the content and modes are unchanged. With fsGroup, everything
// is group-owned by it and group-readable.
func writeAtomic(dir string, files map[string]volFile, fsGroup *int64) error {
	want := map[string]volFile{}
	for p, f := range files {
		clean := path.Clean(p)
		if p == "" || path.IsAbs(p) || clean != p || strings.HasPrefix(clean, "..") {
			return fmt.Errorf("invalid volume file path %q: must be relative, clean, without '..' and not start with '..'", p)
		}
		if fsGroup != nil {
			f.mode |= 0o440
		}
		want[clean] = f
	}
	if same, _ := volumeHolds(dir, want); same {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ts := ".." + time.Now().UTC().Format("2006_01_02_15_04_05.000000000")
	tsDir := filepath.Join(dir, ts)
	if err := os.Mkdir(tsDir, 0o755); err != nil {
		return err
	}
	for p, f := range want {
		full := filepath.Join(tsDir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, f.data, f.mode); err != nil {
			return err
		}
		if err := os.Chmod(full, f.mode); err != nil {
			return err
		}
	}
	if fsGroup != nil {
		if err := filepath.WalkDir(tsDir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if err := os.Lchown(p, -1, int(*fsGroup)); err != nil {
				return err
			}
			if d.IsDir() {
				return os.Chmod(p, 0o755|os.ModeSetgid)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(ts, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	top := map[string]bool{}
	for p := range want {
		top[strings.SplitN(p, "/", 2)[0]] = true
	}
	for name := range top {
		link := filepath.Join(dir, name)
		if target, err := os.Readlink(link); err == nil && target == filepath.Join("..data", name) {
			continue
		}
		_ = os.RemoveAll(link)
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "..") && !top[e.Name()] {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	if old != "" && old != ts {
		_ = os.RemoveAll(filepath.Join(dir, old))
	}
	if fsGroup != nil {
		for _, name := range append([]string{"..data"}, keys(top)...) {
			if err := os.Lchown(filepath.Join(dir, name), -1, int(*fsGroup)); err != nil {
				return err
			}
		}
		if err := os.Chown(dir, -1, int(*fsGroup)); err != nil {
			return err
		}
		return os.Chmod(dir, 0o755|os.ModeSetgid)
	}
	return nil
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// volumeHolds reports whether dir/..data holds exactly want (content and mode).
func volumeHolds(dir string, want map[string]volFile) (bool, error) {
	data := filepath.Join(dir, "..data")
	if _, err := os.Stat(data); err != nil {
		return false, err
	}
	seen := 0
	err := filepath.WalkDir(data+"/", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(data+"/", p)
		f, ok := want[filepath.ToSlash(rel)]
		if !ok {
			return errors.New("extra file")
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm() != f.mode.Perm() || !bytes.Equal(b, f.data) {
			return errors.New("changed")
		}
		seen++
		return nil
	})
	return err == nil && seen == len(want), err
}
