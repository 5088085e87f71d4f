package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/ovlkit/ovlkit/layer"
)

// A name inside a layer is chosen by whoever wrote the layer. Printed raw,
// a newline forges further change lines and an escape sequence reaches the
// terminal of whoever runs `changes`.
func TestChangesTextCannotForgeLines(t *testing.T) {
	ch := []layer.Change{
		{Path: "/a\nD /etc/shadow", Kind: layer.ChangeAdd},
		{Path: "/\x1b[31mred", Kind: layer.ChangeModify},
		{Path: "/plain", Kind: layer.ChangeDelete},
	}
	var out bytes.Buffer
	if err := (command{}).emitChanges(&out, ch); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != len(ch) {
		t.Fatalf("%d changes printed as %d lines: %q", len(ch), len(lines), out.String())
	}
	for _, l := range lines {
		if l == "D /etc/shadow" {
			t.Errorf("forged line %q in %q", l, out.String())
		}
	}
	if strings.ContainsRune(out.String(), 0x1b) {
		t.Errorf("escape byte reached the output: %q", out.String())
	}
	want := "A \"/a\\nD /etc/shadow\"\nC \"/\\033[31mred\"\nD /plain\n"
	if out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
}

func TestQuoteName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/etc/passwd", "/etc/passwd"},
		{"/with space", "/with space"},
		{"/caf\u00e9/\u65e5\u672c", "/caf\u00e9/\u65e5\u672c"}, // UTF-8 text stays readable
		{"/\ufffd", "/\ufffd"},                                 // a real U+FFFD is text
		{"", ""},
		{"/a\nD /etc/shadow", `"/a\nD /etc/shadow"`},
		{"/\x1b[31mred", `"/\033[31mred"`},
		{"/tab\there", `"/tab\there"`},
		{"\a\b\t\n\v\f\r", `"\a\b\t\n\v\f\r"`},
		{"/del\x7f", `"/del\177"`},
		{`/back\slash`, `"/back\\slash"`},
		{`/say "hi"`, `"/say \"hi\""`},
		{"/latin1-caf\xe9", `"/latin1-caf\351"`},
		{"/c1-\u009b31m", `"/c1-\302\23331m"`},         // 8-bit CSI
		{"/rlo-\u202eevil", `"/rlo-\342\200\256evil"`}, // bidi override
		{"/line\u2028sep", `"/line\342\200\250sep"`},   // line separator
		{"/nul\x00", `"/nul\000"`},
	} {
		if got := quoteName(tc.in); got != tc.want {
			t.Errorf("quoteName(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// A quoted name reads back to the exact bytes (the escapes are Go's, which
// are C's), and nothing printed contains a byte below 0x20 or DEL.
func TestQuoteNameRoundTrips(t *testing.T) {
	check := func(s string) {
		q := quoteName(s)
		for i := 0; i < len(q); i++ {
			if q[i] < 0x20 || q[i] == 0x7f {
				t.Fatalf("quoteName(%q) = %q holds control byte %#x", s, q, q[i])
			}
		}
		if !strings.HasPrefix(q, `"`) {
			if q != s {
				t.Fatalf("quoteName(%q) = %q: changed without quotes", s, q)
			}
			return
		}
		back, err := strconv.Unquote(q)
		if err != nil || back != s {
			t.Fatalf("quoteName(%q) = %s reads back as %q (%v)", s, q, back, err)
		}
	}
	for a := 0; a < 256; a++ {
		for b := 0; b < 256; b++ {
			check(string([]byte{'/', byte(a), byte(b)}))
		}
	}
	for _, s := range []string{"\u202e", "\u2066x\u2069", "\u0085", "\xf0\x9f", "\xed\xa0\x80"} {
		check(s)
	}
}

func TestEscapeMessage(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain message", "plain message"},
		{`layer entry "a\n": invalid`, `layer entry "a\n": invalid`}, // already quoted: unchanged
		{"lstat /x/a\nD /etc/shadow: no such file", `lstat /x/a\nD /etc/shadow: no such file`},
		{"open /x/\x1b]0;title\a", `open /x/\033]0;title\a`},
		{"caf\xe9 and caf\u00e9", `caf\351 and caf` + "\u00e9"},
	} {
		if got := escapeMessage(tc.in); got != tc.want {
			t.Errorf("escapeMessage(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// hostileNames are file names a layer can carry; each must come out of
// `changes` as one line of text, and exactly through --json.
var hostileNames = []string{"a\nD /etc/shadow", "\x1b[31mred", `back\slash "q"`, "caf\u00e9", "tab\tcr\r", "rlo\u202etxt.exe"}

// addedPaths is what `changes` lists for a layer of names: each name and
// the directories it implies ("a\nD " and "a\nD /etc" above), sorted.
func addedPaths(names []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range names {
		parts := strings.Split(n, "/")
		for i := range parts {
			p := "/" + strings.Join(parts[:i+1], "/")
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	sort.Strings(out)
	return out
}

func layerWithNames(t *testing.T, names []string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

func TestCLIChangesQuotesHostileNames(t *testing.T) {
	home := filepath.Join(t.TempDir(), "store")
	for _, args := range [][]string{{"init", "--layout", "hardlink"}, {"create", "base"}} {
		if code, _, errs := runCLI(t, "", append([]string{"--home", home}, args...)...); code != 0 {
			t.Fatalf("%v: %s", args, errs)
		}
	}
	if code, _, errs := runCLI(t, layerWithNames(t, hostileNames), "--home", home, "apply", "base"); code != 0 {
		t.Fatalf("apply: %s", errs)
	}

	code, out, errs := runCLI(t, "", "--home", home, "changes", "base")
	if code != 0 {
		t.Fatalf("changes: %s", errs)
	}
	var want []string
	for _, p := range addedPaths(hostileNames) {
		want = append(want, "A "+quoteName(p))
	}
	sort.Strings(want)
	got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	sort.Strings(got)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("changes printed\n%s\nwant the lines\n%s", out, strings.Join(want, "\n"))
	}
	if strings.Contains(out, "\nD /etc/shadow") || strings.ContainsAny(out, "\x1b\r\t\u202e") {
		t.Fatalf("raw name bytes in the text output: %q", out)
	}

	code, out, errs = runCLI(t, "", "--home", home, "--json", "changes", "base")
	if code != 0 {
		t.Fatalf("changes --json: %s", errs)
	}
	var js []struct {
		Path string `json:"path"`
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal([]byte(out), &js); err != nil {
		t.Fatalf("changes --json %q: %v", out, err)
	}
	var paths []string
	for _, c := range js {
		if c.Kind != "add" {
			t.Errorf("%q: kind %q, want add", c.Path, c.Kind)
		}
		paths = append(paths, c.Path)
	}
	exact := addedPaths(hostileNames)
	if strings.Join(paths, "\x00") != strings.Join(exact, "\x00") {
		t.Errorf("--json paths %q, want exactly %q", paths, exact)
	}
}

// Errors name paths too; on standard error they stay one line.
func TestCLIErrorsEscapeNames(t *testing.T) {
	home := filepath.Join(t.TempDir(), "store\nD /etc/shadow")
	code, _, errs := runCLI(t, "", "--home", home, "ls")
	if code == 0 {
		t.Fatal("ls before init succeeded")
	}
	if strings.Count(errs, "\n") != 1 || !strings.Contains(errs, `store\nD /etc/shadow`) {
		t.Fatalf("stderr %q: want one line with the name escaped", errs)
	}
	if code, out, errs := runCLI(t, "", "--home", home, "init"); code != 0 || out != "store "+quoteName(home)+" (layout overlay)\n" {
		t.Fatalf("init: %d %q %q", code, out, errs)
	}
	code, out, _ := runCLI(t, "", "--home", home, "status")
	if code != 0 || !strings.Contains(out, "home:          "+quoteName(home)+"\n") {
		t.Fatalf("status: %d %q", code, out)
	}
}
