package core

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// purePackages are the directories of the core and of the packages it is built from, relative to
// this one: each is held to the same rules (coretest, which builds cores for benchmarks, is not
// one of them).
var purePackages = []string{".", "duetree", "lease", "pace", "policy", "rowstore", "summary"}

// pureImports are the only packages the core and its parts may import besides each other: no
// clock, I/O, goroutines or randomness of its own beyond what these allow (the core's callers
// pass now).
var pureImports = map[string]bool{
	"bytes": true, "cmp": true, "container/heap": true, "encoding/binary": true, "errors": true,
	"fmt": true, "hash/maphash": true, "math": true, "slices": true, "strconv": true,
	"strings": true, "time": true,
	"github.com/renderqueue/renderqueue/pkg/schedule": true,
	// the wire contract's types (it imports time only): the lateness buckets' bounds
	"github.com/renderqueue/renderqueue/pkg/shardapi": true,
}

// corePath is the import path of the core's parts (purePackages, held to the same rules, may be
// imported too).
const corePath = "github.com/renderqueue/renderqueue/pkg/keeper/core/"

func pureImport(path string) bool {
	part, ok := strings.CutPrefix(path, corePath)
	return pureImports[path] || ok && slices.Contains(purePackages, part)
}

// clockFuncs are the time package's functions that read or wait on the clock.
var clockFuncs = map[string]bool{
	"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true, "AfterFunc": true,
	"Tick": true, "NewTimer": true, "NewTicker": true,
}

// TestCoreIsPure: the non-test files of the core and its parts (purePackages) import only
// pureImports — no store, network, logging or synchronisation —, never read the clock and start
// no goroutines, so they stay testable on their own with the clock as a parameter.
func TestCoreIsPure(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && e.Name() != "coretest" && !slices.Contains(purePackages, e.Name()) {
			t.Errorf("package %s is not in purePackages: list it, or say here why it need not be pure", e.Name())
		}
	}
	var files []string
	for _, dir := range purePackages {
		fs, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		if len(fs) == 0 {
			t.Fatalf("%s: no Go files (purePackages names the core's parts)", dir)
		}
		files = append(files, fs...)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range file.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			if !pureImport(path) {
				t.Errorf("%s imports %s: the core takes no I/O, clock or goroutines of its own", f, path)
			}
		}
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "time" && clockFuncs[n.Sel.Name] {
					t.Errorf("%s: time.%s reads the clock; the core takes now as a parameter", fset.Position(n.Pos()), n.Sel.Name)
				}
			case *ast.GoStmt:
				t.Errorf("%s: a go statement; the core starts no goroutines", fset.Position(n.Pos()))
			}
			return true
		})
	}
}
