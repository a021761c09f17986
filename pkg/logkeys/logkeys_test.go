package logkeys

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// synonyms are spellings of the keys that log calls must not use: a log pipeline following
// renderqueue=web would miss them.
var synonyms = map[string]string{
	"ns": Namespace, "queue": RenderQueue, "rq": RenderQueue, "renderQueue": RenderQueue, "RenderQueue": RenderQueue,
	"queueName": RenderQueue, "shardName": Shard, "shard_name": Shard, "slotSet": Slots, "slot_set": Slots,
}

// logKeys returns the string-literal keys of a logr call (Info(msg, kv...), Error(err, msg,
// kv...), WithValues(kv...)) with their positions, or nothing for another call.
func logKeys(call *ast.CallExpr) []*ast.BasicLit {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return nil
	}
	first := 0
	switch sel.Sel.Name {
	case "Info":
		first = 1
	case "Error":
		first = 2
	case "WithValues":
		first = 0
	default:
		return nil
	}
	var out []*ast.BasicLit
	for i := first; i < len(call.Args); i += 2 {
		if lit, ok := call.Args[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
			out = append(out, lit)
		}
	}
	return out
}

// badKeys scans the Go files under root (not tests, not the e2e harness) for log calls keyed by
// a synonym of a pkg/logkeys key.
func badKeys(t *testing.T, root string) []string {
	t.Helper()
	var bad []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name == "e2e" || name == "testdata" || (strings.HasPrefix(name, ".") && path != root) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			for _, lit := range logKeys(call) {
				key, err := strconv.Unquote(lit.Value)
				if err != nil {
					continue
				}
				if want, ok := synonyms[key]; ok {
					bad = append(bad, fset.Position(lit.Pos()).String()+": log key "+strconv.Quote(key)+", want "+strconv.Quote(want))
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return bad
}

// TestLogKeys checks every log call of the repository's Go code (operator, keeper, metrics API,
// console, clients, tools): a RenderQueue, its namespace, a shard and slots are logged under the
// keys of this package, never another spelling.
func TestLogKeys(t *testing.T) {
	for _, b := range badKeys(t, filepath.Join("..", "..")) {
		t.Error(b)
	}
}

// TestLogKeysCatches checks that the scan finds a synonym.
func TestLogKeysCatches(t *testing.T) {
	dir := t.TempDir()
	src := "package x\n\nfunc f(log interface{ Info(string, ...any) }) {\n\tlog.Info(\"Created\", \"queue\", \"web\", \"shard\", \"web-shard-0\")\n}\n"
	if err := writeFile(filepath.Join(dir, "x.go"), src); err != nil {
		t.Fatal(err)
	}
	bad := badKeys(t, dir)
	if len(bad) != 1 || !strings.Contains(bad[0], `log key "queue", want "renderqueue"`) {
		t.Fatalf("the scan found %q", bad)
	}
}

func writeFile(path, content string) error {
	return os.WriteFile(path, []byte(content), 0o644)
}
