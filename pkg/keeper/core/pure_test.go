package core

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// pureImports are the only packages the core may import: no clock, I/O, goroutines or
// randomness of its own beyond what these allow (the core's callers pass now).
var pureImports = map[string]bool{
	"bytes": true, "cmp": true, "container/heap": true, "encoding/binary": true, "errors": true,
	"fmt": true, "hash/maphash": true, "math": true, "slices": true, "strconv": true,
	"strings": true, "time": true,
	"github.com/renderqueue/renderqueue/pkg/schedule": true,
	// the wire contract's types (it imports time only): the lateness buckets' bounds
	"github.com/renderqueue/renderqueue/pkg/shardapi": true,
}

// clockFuncs are the time package's functions that read or wait on the clock.
var clockFuncs = map[string]bool{
	"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true, "AfterFunc": true,
	"Tick": true, "NewTimer": true, "NewTicker": true,
}

// TestCoreIsPure: the core's non-test files import only pureImports — no store, network,
// logging or synchronisation —, never read the clock and start no goroutines, so it stays
// testable on its own with the clock as a parameter.
func TestCoreIsPure(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
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
			if !pureImports[path] {
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
