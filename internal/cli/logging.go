package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
)

// Log formats of --log-format.
const (
	LogFormatText = "text"
	LogFormatJSON = "json"
)

// LogFlags are the logging flags of every long-running command (operator, keeper, worker-sim):
// --log-format (text or json), --log-level, and -v, the older spelling of --log-level=debug.
type LogFlags struct {
	Format  string
	Level   string
	verbose bool
}

// Bind registers the flags on fs. verbose describes what -v adds for this command.
func (f *LogFlags) Bind(fs *flag.FlagSet, verbose string) {
	fs.StringVar(&f.Format, "log-format", LogFormatText,
		"log format: text (key=value lines) or json (one JSON object a line); client-go's and the Kubernetes libraries' klog lines go through the same logger")
	fs.StringVar(&f.Level, "log-level", "info",
		"least severe messages logged: error, warn, info, debug (as -v), or a verbosity N (info and V(1)..V(N))")
	fs.BoolVar(&f.verbose, "v", false, verbose+" (--log-level=debug)")
}

// debugVerbosity is the logr verbosity --log-level=debug (and -v) logs up to.
const debugVerbosity = 5

// level parses --log-level into a slog level (logr's V(n) is slog level -n) and the verbosity klog
// is given.
func (f *LogFlags) level() (slog.Level, int, error) {
	lvl := strings.ToLower(strings.TrimSpace(f.Level))
	if f.verbose && (lvl == "" || lvl == "info") {
		lvl = "debug"
	}
	switch lvl {
	case "error":
		return slog.LevelError, 0, nil
	case "warn", "warning":
		return slog.LevelWarn, 0, nil
	case "", "info":
		return slog.LevelInfo, 0, nil
	case "debug":
		return slog.Level(-debugVerbosity), debugVerbosity, nil
	}
	n, err := strconv.Atoi(lvl)
	if err != nil || n < 0 || n > 127 {
		return 0, 0, fmt.Errorf("--log-level %q: want error, warn, info, debug or a verbosity from 0 to 127", f.Level)
	}
	return slog.Level(-n), n, nil
}

// jsonLogging is set once a command has configured JSON logs, so that run reports the command's
// error as a JSON line too (ReportError).
var jsonLogging atomic.Bool

// Logger returns the command's logger, writing to w in the chosen format at the chosen level, and
// makes it the process's only log output: klog (client-go, the Kubernetes API server libraries)
// logs through it with the same verbosity, and so does the standard library's log package (the
// default slog logger), so that with --log-format=json every line on w is a JSON object.
func (f *LogFlags) Logger(w io.Writer) (logr.Logger, error) {
	level, klogV, err := f.level()
	if err != nil {
		return logr.Logger{}, err
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch f.Format {
	case LogFormatText, "":
		h = slog.NewTextHandler(w, opts)
	case LogFormatJSON:
		h = slog.NewJSONHandler(w, opts)
	default:
		return logr.Logger{}, fmt.Errorf("--log-format %q: want %s or %s", f.Format, LogFormatText, LogFormatJSON)
	}
	log := logr.FromSlogHandler(h)
	slog.SetDefault(slog.New(h))
	// klog's own verbosity gates its V(n) calls before they reach the logger
	kfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	kfs.SetOutput(io.Discard)
	klog.InitFlags(kfs)
	if err := kfs.Set("v", strconv.Itoa(klogV)); err != nil {
		return logr.Logger{}, fmt.Errorf("setting klog's verbosity: %w", err)
	}
	klog.SetLoggerWithOptions(log, klog.ContextualLogger(true))
	jsonLogging.Store(f.Format == LogFormatJSON)
	return log, nil
}

// JSONLogging reports whether the command logs JSON (LogFlags.Logger with --log-format=json).
func JSONLogging() bool { return jsonLogging.Load() }

// ReportError writes a command's final error to stderr: a log line of the default logger when the
// command logs JSON (so that stderr holds only JSON lines), msg as it is otherwise.
func ReportError(stderr io.Writer, msg string) {
	if JSONLogging() {
		slog.Default().Error(msg)
		return
	}
	_, _ = fmt.Fprintln(stderr, msg)
}

// ParseFlags parses args into fs. The usage -h or --help asks for goes to stdout (and ParseFlags
// returns flag.ErrHelp); a parse error and the usage that follows it go to stderr. fs's Usage
// must write to fs.Output().
func ParseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	var buf strings.Builder
	fs.SetOutput(&buf)
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	out := stderr
	if errors.Is(err, flag.ErrHelp) {
		out = stdout
	}
	_, _ = io.WriteString(out, buf.String())
	return err
}
