// Package docs holds the project's documentation; its test checks the links of every Markdown
// file of the repository.
package docs

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// repo is the repository root, from this package's directory.
const repo = ".."

var (
	// inline links and images: [text](target "title") — the text may hold one level of brackets
	inlineLinkRE = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	// reference definitions: [label]: target
	refDefRE = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
	// headings: ATX only (the project writes no setext headings)
	headingRE = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	// explicit anchors: <a name="x"> or id="x"
	htmlAnchorRE = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	// inline code spans, removed before links are looked for
	codeSpanRE = regexp.MustCompile("`+[^`]*`+")
	// a code span naming a Markdown file of the repository, as the docs often do: `docs/x.md`
	// (with a directory: a bare `NOTES.md` may name a file of something else, a release say)
	codeSpanDocRE = regexp.MustCompile("`((?:[A-Za-z0-9_.-]+/)+[A-Za-z0-9_-]+\\.md)(#[A-Za-z0-9_-]+)?`")
	// what GitHub drops from a heading before making its anchor: link targets, images, HTML tags
	headingLinkRE = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTagRE     = regexp.MustCompile(`<[^>]+>`)
)

// doc is a Markdown file: its lines outside fenced code blocks, and its anchors.
type doc struct {
	lines   []numbered
	anchors map[string]bool
}

type numbered struct {
	n    int
	text string
}

// parse reads a Markdown file, dropping fenced code blocks, and computes the anchors GitHub
// gives its headings.
func parse(path string) (*doc, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	d := &doc{anchors: map[string]bool{}}
	seen := map[string]int{}
	fence := ""
	for i, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		d.lines = append(d.lines, numbered{i + 1, line})
		if m := headingRE.FindStringSubmatch(line); m != nil {
			a := Anchor(m[2])
			if n := seen[a]; n > 0 {
				d.anchors[fmt.Sprintf("%s-%d", a, n)] = true
			} else {
				d.anchors[a] = true
			}
			seen[a]++
		}
		for _, m := range htmlAnchorRE.FindAllStringSubmatch(line, -1) {
			d.anchors[m[1]] = true
		}
	}
	return d, nil
}

// Anchor is the anchor GitHub gives a Markdown heading: its text (link targets, HTML tags and
// emphasis and code markers dropped), lower case, every character other than a letter, a digit,
// a space, a hyphen or an underscore removed, and each space a hyphen.
func Anchor(heading string) string {
	h := headingLinkRE.ReplaceAllString(heading, "$1")
	h = htmlTagRE.ReplaceAllString(h, "")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// markdownFiles lists the repository's Markdown files (not under .git, .tmp, bin or
// node_modules).
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".tmp", "bin", "node_modules", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// brokenLinks checks every relative link of the Markdown files under root: the file or directory
// exists, and an anchor (in the same file or another Markdown file) is a heading of it.
func brokenLinks(t *testing.T, root string) (broken []string, links int) {
	t.Helper()
	files := markdownFiles(t, root)
	docs := map[string]*doc{}
	load := func(path string) (*doc, error) {
		if d, ok := docs[path]; ok {
			return d, nil
		}
		d, err := parse(path)
		if err == nil {
			docs[path] = d
		}
		return d, err
	}
	for _, file := range files {
		d, err := load(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, file)
		for _, line := range d.lines {
			text := codeSpanRE.ReplaceAllString(line.text, "")
			var targets []string
			// `docs/x.md` names a file relative to the repository's root (or to the file's
			// directory): it must exist
			// (a link's text is its target's business)
			for _, m := range codeSpanDocRE.FindAllStringSubmatch(inlineLinkRE.ReplaceAllString(line.text, ""), -1) {
				links++
				name := filepath.FromSlash(m[1])
				_, errHere := os.Stat(filepath.Join(filepath.Dir(file), name))
				_, errRoot := os.Stat(filepath.Join(root, name))
				if errHere != nil && errRoot != nil {
					broken = append(broken, fmt.Sprintf("%s:%d: %s: no such file", rel, line.n, m[1]))
				}
			}
			for _, m := range inlineLinkRE.FindAllStringSubmatch(text, -1) {
				targets = append(targets, m[1])
			}
			for _, m := range refDefRE.FindAllStringSubmatch(text, -1) {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				u, err := url.Parse(target)
				if err != nil {
					broken = append(broken, fmt.Sprintf("%s:%d: %q does not parse: %v", rel, line.n, target, err))
					continue
				}
				if u.Scheme != "" || u.Host != "" || target == "" {
					continue // absolute URLs (https:, mailto:) are not checked here
				}
				links++
				path := file
				if u.Path != "" {
					path = filepath.Join(filepath.Dir(file), filepath.FromSlash(u.Path))
					if _, err := os.Stat(path); err != nil {
						broken = append(broken, fmt.Sprintf("%s:%d: %s: no such file", rel, line.n, target))
						continue
					}
				}
				if u.Fragment == "" {
					continue
				}
				if !strings.HasSuffix(path, ".md") {
					continue // an anchor into code (#L10) or another kind of file
				}
				td, err := load(path)
				if err != nil {
					t.Fatal(err)
				}
				if !td.anchors[u.Fragment] {
					broken = append(broken, fmt.Sprintf("%s:%d: %s: no heading with the anchor #%s", rel, line.n, target, u.Fragment))
				}
			}
		}
	}
	return broken, links
}

// TestLinks checks every relative link and anchor of the repository's Markdown files.
func TestLinks(t *testing.T) {
	broken, links := brokenLinks(t, repo)
	for _, b := range broken {
		t.Error(b)
	}
	if links < 20 {
		t.Errorf("only %d relative links found: is the link pattern broken?", links)
	}
	t.Logf("%d relative links checked", links)
}

// TestLinksCatch checks that the checker finds a missing file, a missing anchor and a link inside
// a table cell, and passes what exists (a heading with code and punctuation, a duplicate heading,
// a link in a code span or a fenced block, absolute URLs).
func TestLinksCatch(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.md", "# A\n\n## The `--log-format` flag (JSON)\n\n## Notes\n\n## Notes\n\n"+
		"[ok](b.md#second-part), [ok](#the---log-format-flag-json), [ok](#notes-1), [web](https://example.com/x.md#nope)\n\n"+
		"`[not a link](missing.md)`\n\n```\n[not a link](missing.md)\n```\n\n"+
		"| x | [gone](missing.md) |\n\n[bad anchor](b.md#third-part) and [bad self](#nothing)\n\n[ref]: ./b.md#first\n\n"+
		"See `b.md`, `./b.md` and `docs/gone.md`; [`c.md`](b.md).\n")
	write("b.md", "# First\n\nText.\n\n## Second part\n")
	broken, links := brokenLinks(t, dir)
	want := []string{
		"a.md:17: missing.md: no such file",
		"a.md:19: b.md#third-part: no heading with the anchor #third-part",
		"a.md:19: #nothing: no heading with the anchor #nothing",
		"a.md:23: docs/gone.md: no such file",
	}
	if strings.Join(broken, "\n") != strings.Join(want, "\n") || links != 10 {
		t.Fatalf("found %d links, broken:\n%s\nwant:\n%s", links, strings.Join(broken, "\n"), strings.Join(want, "\n"))
	}
}
