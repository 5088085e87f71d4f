// Package verdict decides what a run of guest tests showed: it turns the
// test binaries' output into go test -json events and tests, reads the
// proofs and keeps the tests declare and checks them against the series of
// the kernel base (a proof must fail on the stock kernel and pass on the
// patched one, a keeps test must pass on both), finds kernel reports in
// the kernel log, and compares the stock and the patched run. It boots
// nothing: package vm does, and package report writes the results out.
package verdict

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
	"time"

	"github.com/ovlkit/ovlkit/vm/guestproto"
)

// Event is one go test -json event (cmd/test2json's format).
type Event struct {
	Time    time.Time `json:",omitempty"`
	Action  string
	Package string  `json:",omitempty"`
	Test    string  `json:",omitempty"`
	Elapsed float64 `json:",omitempty"`
	Output  string  `json:",omitempty"`
}

// Status of one test after the harness has judged it.
type Status string

const (
	Pass Status = "pass"
	Fail Status = "fail"
	Skip Status = "skip"
	// ExpectedFail is a test that proves a patch failing on the stock
	// kernel, which is what it is for.
	ExpectedFail Status = "expected-fail"
	// UnexpectedPass is a proof test that passes on the stock kernel: it
	// does not show what its patch changes.
	UnexpectedPass Status = "unexpected-pass"
)

// Test is the result of one test or subtest.
type Test struct {
	Package string
	Name    string // full name, e.g. TestCopyUp/ext4/KeepsMode
	Action  string // pass, fail or skip as the test binary reported it
	Status  Status
	Elapsed float64
	Output  string
	Proves  []string // patch subjects declared with guesttest.Proves
	Keeps   []string // behaviour declared kept with guesttest.Keeps
	// Elsewhere are the Proves subjects that are patches of another
	// base's series but not of this one: ScopeProofs moved them to Keeps.
	Elsewhere []string
	// Kind is what the nearest declaration, on the test or an enclosing
	// test, makes of it; set by judge.
	Kind Kind
	Leaf bool // has no subtests
}

// Kind tells a proof test and a keeps test from a plain one.
type Kind string

const (
	Plain Kind = ""
	// Proof tests (guesttest.Proves) fail on the stock kernel and pass
	// on the patched one.
	Proof Kind = "proves"
	// Kept tests (guesttest.Keeps) pass on both kernels.
	Kept Kind = "keeps"
)

// FS returns the filesystem a test ran on, from its name, or "-".
func (t *Test) FS() string {
	for _, part := range strings.Split(t.Name, "/") {
		switch part {
		case "tmpfs", "ext4", "xfs", "btrfs", "ramfs":
			return part
		}
	}
	return "-"
}

// toEvents converts one binary's raw -test.v=test2json output to events
// with the toolchain's own converter.
func toEvents(goBin, pkg string, raw []byte) ([]Event, error) {
	// -t: test2json only reports a test's elapsed time in timestamp mode.
	cmd := exec.Command(goBin, "tool", "test2json", "-t", "-p", pkg)
	cmd.Stdin = bytes.NewReader(raw)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go tool test2json for %s: %v: %s", pkg, err, stderr.String())
	}
	var evs []Event
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("test2json output for %s: %w", pkg, err)
		}
		evs = append(evs, e)
	}
	return evs, sc.Err()
}

// collectTests folds events into per-test results.
func collectTests(evs []Event) []*Test {
	byKey := map[string]*Test{}
	var order []*Test
	get := func(pkg, name string) *Test {
		k := pkg + "\x00" + name
		t, ok := byKey[k]
		if !ok {
			t = &Test{Package: pkg, Name: name, Leaf: true}
			byKey[k] = t
			order = append(order, t)
		}
		return t
	}
	for _, e := range evs {
		if e.Test == "" {
			continue
		}
		t := get(e.Package, e.Test)
		switch e.Action {
		case "output":
			t.Output += e.Output
			if i := strings.Index(e.Output, guestproto.ProofMarker); i >= 0 {
				subj := strings.TrimSpace(e.Output[i+len(guestproto.ProofMarker):])
				t.Proves = append(t.Proves, subj)
			}
			if i := strings.Index(e.Output, guestproto.KeepsMarker); i >= 0 {
				what := strings.TrimSpace(e.Output[i+len(guestproto.KeepsMarker):])
				t.Keeps = append(t.Keeps, what)
			}
		case "pass", "fail", "skip":
			t.Action = e.Action
			t.Elapsed = e.Elapsed
		}
	}
	for _, t := range order {
		if i := strings.LastIndex(t.Name, "/"); i >= 0 {
			if p, ok := byKey[t.Package+"\x00"+t.Name[:i]]; ok {
				p.Leaf = false
			}
		}
	}
	return order
}

// judgeTests sets each test's Kind and Status and returns the contradictions it
// found among the declarations. A test's kind comes from the nearest
// declaration on it or an enclosing test; a test that declares both Proves
// and Keeps counts as a keeps test. On the stock kernel a failing test is
// expected when it is a proof test, or when all its failing subtests are
// expected, and never when it is a keeps test; a test that declared a proof
// itself and passes is an unexpected pass.
func judgeTests(tests []*Test, stock bool) []string {
	problems := declare(tests)
	grade(tests, stock)
	return problems
}

// declare sets each test's Kind from its declarations and those of the
// tests enclosing it, and returns the contradictions among them.
func declare(tests []*Test) []string {
	byName := map[string]*Test{}
	for _, t := range tests {
		byName[t.Package+"\x00"+t.Name] = t
	}
	// declaring returns the nearest enclosing test (not t itself) with a
	// declaration, or nil.
	declaring := func(t *Test) *Test {
		name := t.Name
		for {
			i := strings.LastIndex(name, "/")
			if i < 0 {
				return nil
			}
			name = name[:i]
			if p := byName[t.Package+"\x00"+name]; p != nil && (len(p.Proves) > 0 || len(p.Keeps) > 0) {
				return p
			}
		}
	}
	var problems []string
	for _, t := range tests {
		switch {
		case len(t.Keeps) > 0:
			t.Kind = Kept
		case len(t.Proves) > 0:
			t.Kind = Proof
		default:
			t.Kind = Plain
		}
		if len(t.Keeps) > 0 && len(t.Proves) > 0 {
			problems = append(problems, fmt.Sprintf(
				"%s %s declares both that it proves %q and that it keeps %q: a test cannot fail and pass on the stock kernel",
				SuiteName(t.Package), t.Name, strings.Join(t.Proves, "; "), strings.Join(t.Keeps, "; ")))
		}
		p := declaring(t)
		if p == nil {
			continue
		}
		if t.Kind == Plain {
			t.Kind = Kept
			if len(p.Keeps) == 0 {
				t.Kind = Proof
			}
		}
		if len(t.Proves) > 0 && len(p.Keeps) > 0 {
			problems = append(problems, fmt.Sprintf(
				"%s %s proves %q inside %s, which keeps %q: the enclosing test would have to fail on the stock kernel",
				SuiteName(t.Package), t.Name, strings.Join(t.Proves, "; "), p.Name, strings.Join(p.Keeps, "; ")))
		}
	}
	return problems
}

// grade sets each test's Status from its result and Kind: on the stock
// kernel a failing proof test is expected, a passing one that declared the
// proof itself is not.
func grade(tests []*Test, stock bool) {
	children := map[string][]*Test{}
	for _, t := range tests {
		if i := strings.LastIndex(t.Name, "/"); i >= 0 {
			k := t.Package + "\x00" + t.Name[:i]
			children[k] = append(children[k], t)
		}
	}
	var excused func(t *Test) bool
	excused = func(t *Test) bool {
		if t.Kind == Kept {
			return false
		}
		failing := 0
		for _, c := range children[t.Package+"\x00"+t.Name] {
			if c.Action != "fail" {
				continue
			}
			failing++
			// A failing keeps subtest is a regression even inside a
			// proof, so it must not excuse the proof either.
			if !excused(c) {
				return false
			}
		}
		return t.Kind == Proof || failing > 0
	}
	for _, t := range tests {
		switch {
		case t.Action == "" && isBenchmark(t.Name):
			// A benchmark that ran reports its numbers, not pass; one that
			// failed reports "--- FAIL", which test2json turns into fail.
			t.Status = Pass
		case t.Action == "" || t.Action == "fail":
			t.Status = Fail
			if stock && t.Action == "fail" && excused(t) {
				t.Status = ExpectedFail
			}
		case t.Action == "skip":
			t.Status = Skip
		case stock && len(t.Proves) > 0:
			t.Status = UnexpectedPass
		default:
			t.Status = Pass
		}
	}
}

// rejudge applies declarations changed after judge (ScopeProofs turns
// proofs into keeps): the kinds are derived again, contradictions not
// reported yet are added, and the statuses graded again. The run does not
// record whether it was the stock kernel's, and need not: expected-fail and
// unexpected-pass arise only there, and turning a proof into a keeps test
// can only take such statuses away, so without either the stock and the
// patched grading agree.
func (r *Result) rejudge() {
	seen := map[string]bool{}
	for _, p := range r.Problems {
		seen[p] = true
	}
	for _, p := range declare(r.Tests) {
		if !seen[p] {
			r.Problems = append(r.Problems, p)
		}
	}
	stock := false
	for _, t := range r.Tests {
		if t.Status == ExpectedFail || t.Status == UnexpectedPass {
			stock = true
		}
	}
	grade(r.Tests, stock)
}

func isBenchmark(name string) bool {
	return strings.HasPrefix(name, "Benchmark")
}

// Summary row: one suite on one filesystem. Proves and Keeps count the
// passing proof and keeps tests, which Passed includes.
type Row struct {
	Suite, FS                       string
	Passed, Failed, Expected, Skips int
	Proves, Keeps                   int
	Seconds                         float64
}

// Summarize counts leaf tests per (suite, filesystem).
func Summarize(tests []*Test) []Row {
	rows := map[[2]string]*Row{}
	for _, t := range tests {
		if !t.Leaf {
			continue
		}
		k := [2]string{SuiteName(t.Package), t.FS()}
		r, ok := rows[k]
		if !ok {
			r = &Row{Suite: k[0], FS: k[1]}
			rows[k] = r
		}
		switch t.Status {
		case Pass:
			r.Passed++
			switch t.Kind {
			case Proof:
				r.Proves++
			case Kept:
				r.Keeps++
			}
		case ExpectedFail:
			r.Expected++
		case Skip:
			r.Skips++
		default:
			r.Failed++
		}
		r.Seconds += t.Elapsed
	}
	out := make([]Row, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Suite != out[j].Suite {
			return out[i].Suite < out[j].Suite
		}
		return fsOrder(out[i].FS) < fsOrder(out[j].FS)
	})
	return out
}

func fsOrder(fs string) int {
	for i, n := range []string{"-", "tmpfs", "ext4", "xfs", "btrfs", "ramfs"} {
		if fs == n {
			return i
		}
	}
	return 99
}

// SuiteName shortens an import path to what follows tests/guest/.
func SuiteName(pkg string) string {
	if i := strings.Index(pkg, "/tests/guest/"); i >= 0 {
		return pkg[i+len("/tests/guest/"):]
	}
	if i := strings.LastIndex(pkg, "/"); i >= 0 {
		return pkg[i+1:]
	}
	return pkg
}

// ReadEvents parses a go test -json stream.
func ReadEvents(r io.Reader) ([]Event, error) {
	var evs []Event
	dec := json.NewDecoder(r)
	for {
		var e Event
		err := dec.Decode(&e)
		if err == io.EOF {
			return evs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("go test -json stream: %w", err)
		}
		evs = append(evs, e)
	}
}

// ResultFromEvents judges a go test -json stream that did not come from a
// guest (the host unit tests), so it can share the table and JUnit output.
func ResultFromEvents(label string, evs []Event) *Result {
	r := &Result{Label: label, Events: evs, Uname: "host"}
	r.Tests = collectTests(evs)
	r.Problems = append(r.Problems, judgeTests(r.Tests, false)...)
	for _, e := range evs {
		// A package that fails to build or panics outside a test has
		// only a package-level fail event.
		if e.Test == "" && e.Action == "fail" {
			r.Problems = append(r.Problems, "package "+e.Package+" failed")
		}
	}
	return r
}

// CompareRuns checks two runs of the same suites on different kernels (the
// patched and the stock one): every proof and keeps leaf test that ran on
// one kernel must have run on the other too, or the pair shows nothing
// about it. A test the other run skipped, or never started, is a problem
// of that run, one per package listing the tests. A test whose enclosing
// test failed there before starting it is not: that failure is judged on
// its own.
func CompareRuns(a, b *Result) {
	b.Problems = append(b.Problems, missingFrom(a, b)...)
	a.Problems = append(a.Problems, missingFrom(b, a)...)
}

// missingFrom lists the proof and keeps leaf tests that ran in from but not
// in other, grouped by package.
func missingFrom(from, other *Result) []string {
	there := map[string]*Test{}
	for _, t := range other.Tests {
		there[t.Package+"\x00"+t.Name] = t
	}
	covered := func(t *Test) bool {
		if o := there[t.Package+"\x00"+t.Name]; o != nil {
			return o.Status != Skip
		}
		name := t.Name
		for {
			i := strings.LastIndex(name, "/")
			if i < 0 {
				return false
			}
			name = name[:i]
			if o := there[t.Package+"\x00"+name]; o != nil {
				return o.Leaf && (o.Status == Fail || o.Status == ExpectedFail)
			}
		}
	}
	var pkgs []string
	byPkg := map[string][]string{}
	for _, t := range from.Tests {
		if !t.Leaf || t.Kind == Plain || t.Status == Skip || covered(t) {
			continue
		}
		why := "did not run"
		if o := there[t.Package+"\x00"+t.Name]; o != nil {
			why = "skipped"
		}
		if _, ok := byPkg[t.Package]; !ok {
			pkgs = append(pkgs, t.Package)
		}
		byPkg[t.Package] = append(byPkg[t.Package], fmt.Sprintf("%s test %s: %s", t.Kind, t.Name, why))
	}
	var problems []string
	for _, pkg := range pkgs {
		lines := byPkg[pkg]
		problems = append(problems, fmt.Sprintf("%s: proof or keeps tests that ran on %s did not run on %s, so the two kernels are not compared on them:\n    %s",
			SuiteName(pkg), from.Label, other.Label, strings.Join(lines, "\n    ")))
	}
	return problems
}
