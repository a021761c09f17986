// Command podtest is the program the runner test (package cluster) runs as its Pods'
// containers, mapped from the image "podtest". It reports what a container sees:
//
//	podtest serve --listen :8080 [--unhealthy-after 2s] [--files DIR] [--write FILE]... [--read FILE]...
//	             [--term-delay 1s]
//	    serves GET /report (JSON: user, groups, hostname, capabilities, writes to /, /tmp and DIR,
//	    the files under DIR, the --write files ("mark") and the --read files, the environment, and who the API server says it is through
//	    rest.InClusterConfig), /readyz, and /healthz (503 once --unhealthy-after has passed);
//	    with --term-delay it exits 42 that long after a SIGTERM
//	podtest crash --lines N --code C
//	    prints N numbered lines and exits with C
//	podtest message TEXT
//	    writes TEXT to /dev/termination-log and exits 0
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Report is what /report answers.
type Report struct {
	Argv      []string          `json:"argv"`
	UID       int               `json:"uid"`
	GID       int               `json:"gid"`
	Groups    []int             `json:"groups"`
	Hostname  string            `json:"hostname"`
	WriteRoot string            `json:"writeRoot"` // the error writing /podtest-write ("" = it worked)
	WriteTmp  string            `json:"writeTmp"`
	WriteDir  string            `json:"writeDir"` // the error writing into --files
	Reads     map[string]string `json:"reads"`    // the --read files (or the error)
	Writes    map[string]string `json:"writes"`   // the error writing each --write file ("" = it worked)
	Status    map[string]string `json:"status"`   // NoNewPrivs, CapBnd, CapEff of /proc/self/status
	Env       map[string]string `json:"env"`
	Files     map[string]File   `json:"files"`
	User      string            `json:"user"` // SelfSubjectReview through rest.InClusterConfig
	UserError string            `json:"userError"`
	Namespace string            `json:"namespace"` // the ServiceAccount volume's namespace file
	CA        string            `json:"ca"`
}

// File is a file under --files.
type File struct {
	Content string `json:"content"`
	Mode    string `json:"mode"`
	GID     int    `json:"gid"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: podtest serve|crash|message ...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2:])
	case "crash":
		fs := flag.NewFlagSet("crash", flag.ExitOnError)
		lines := fs.Int("lines", 10, "lines to print")
		code := fs.Int("code", 1, "exit code")
		_ = fs.Parse(os.Args[2:])
		for i := 1; i <= *lines; i++ {
			fmt.Printf("line %d\n", i)
		}
		os.Exit(*code)
	case "message":
		if err := os.WriteFile("/dev/termination-log", []byte(strings.Join(os.Args[2:], " ")), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}

func serve(args []string) {
	fset := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := fset.String("listen", ":8080", "listen address")
	unhealthyAfter := fset.Duration("unhealthy-after", 0, "fail /healthz after this long (0: never)")
	files := fset.String("files", "", "directory whose files to report")
	termDelay := fset.Duration("term-delay", -1, "on SIGTERM, wait this long, then exit 42 (negative: SIGTERM kills as usual)")
	var reads, writes stringList
	fset.Var(&reads, "read", "a file to report (repeatable)")
	fset.Var(&writes, "write", "a file to write \"mark\" into, before the reads (repeatable)")
	_ = fset.Parse(args)
	if *termDelay >= 0 {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		go func() {
			<-sig
			fmt.Printf("SIGTERM: exiting in %s\n", *termDelay)
			time.Sleep(*termDelay)
			os.Exit(42)
		}()
	}
	start := time.Now()
	rep := report(*files, writes, reads)
	b, _ := json.Marshal(rep)
	fmt.Printf("report %s\n", b)

	mux := http.NewServeMux()
	mux.HandleFunc("/report", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(rep)
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if *unhealthyAfter > 0 && time.Since(start) > *unhealthyAfter {
			http.Error(w, "unhealthy on purpose", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	fmt.Printf("listening on %s\n", *listen)
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func report(dir string, writes, reads []string) Report {
	r := Report{Argv: os.Args, UID: os.Getuid(), GID: os.Getgid(), Env: map[string]string{}, Files: map[string]File{}, Status: map[string]string{},
		Reads: map[string]string{}, Writes: map[string]string{}}
	for _, p := range writes {
		r.Writes[p] = errString(os.WriteFile(p, []byte("mark"), 0o644))
	}
	for _, p := range reads {
		b, err := os.ReadFile(p)
		if err != nil {
			r.Reads[p] = "error: " + err.Error()
		} else {
			r.Reads[p] = string(b)
		}
	}
	r.Groups, _ = os.Getgroups()
	r.Hostname, _ = os.Hostname()
	r.WriteRoot = errString(os.WriteFile("/podtest-write", []byte("x"), 0o644))
	r.WriteTmp = errString(os.WriteFile("/tmp/podtest-write", []byte("x"), 0o644))
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if ok && (k == "NoNewPrivs" || k == "CapBnd" || k == "CapEff" || k == "CapPrm") {
				r.Status[k] = strings.TrimSpace(v)
			}
		}
	}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		r.Env[k] = v
	}
	if dir != "" {
		walk(dir, "", r.Files)
		r.WriteDir = errString(os.WriteFile(filepath.Join(dir, "podtest-write"), []byte("x"), 0o644))
	}
	const sa = "/var/run/secrets/kubernetes.io/serviceaccount"
	ns, _ := os.ReadFile(sa + "/namespace")
	r.Namespace = string(ns)
	ca, _ := os.ReadFile(sa + "/ca.crt")
	r.CA = string(ca)
	cfg, err := rest.InClusterConfig()
	if err != nil {
		r.UserError = err.Error()
		return r
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		r.UserError = err.Error()
		return r
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ssr, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		r.UserError = err.Error()
		return r
	}
	r.User = ssr.Status.UserInfo.Username
	return r
}

// walk reports the files under dir (following symlinks, as a reader of a secret volume does;
// the atomic writer's ..data entries are skipped).
func walk(dir, rel string, out map[string]File) {
	entries, err := os.ReadDir(filepath.Join(dir, rel))
	if err != nil {
		return
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "..") {
			continue
		}
		r := filepath.Join(rel, e.Name())
		p := filepath.Join(dir, r)
		fi, err := os.Stat(p)
		if err != nil {
			continue
		}
		if fi.IsDir() {
			walk(dir, r, out)
			continue
		}
		b, err := os.ReadFile(p)
		f := File{Content: string(b), Mode: fi.Mode().Perm().String()}
		if err != nil {
			f.Content = "error: " + err.Error()
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			f.GID = int(st.Gid)
		}
		out[r] = f
	}
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(s string) error {
	*l = append(*l, s)
	return nil
}
