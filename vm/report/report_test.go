package report

import (
	"encoding/xml"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/ovlkit/ovlkit/vm/verdict"
)

// kindsRuns is one suite with a keeps, a proof and a plain test, judged on
// the patched and the stock kernel.
func kindsRuns() (patched, stock *verdict.Result) {
	run := func(label string, proof verdict.Status) *verdict.Result {
		return &verdict.Result{Label: label, Tests: []*verdict.Test{
			leaf("TestKeep/tmpfs", verdict.Kept, verdict.Pass),
			leaf("TestKeep/ext4", verdict.Kept, verdict.Pass),
			parent("TestKeep", verdict.Kept),
			leaf("TestProof/tmpfs", verdict.Proof, proof),
			parent("TestProof", verdict.Proof),
			leaf("TestPlain/tmpfs", verdict.Plain, verdict.Pass),
			leaf("TestPlain/ext4", verdict.Plain, verdict.Skip),
			parent("TestPlain", verdict.Plain),
		}}
	}
	return run("patched", verdict.Pass), run("stock", verdict.ExpectedFail)
}

const testPkg = "m/tests/guest/x"

// leaf is a judged test without subtests.
func leaf(name string, kind verdict.Kind, status verdict.Status) *verdict.Test {
	action := map[verdict.Status]string{
		verdict.Pass: "pass", verdict.Fail: "fail", verdict.Skip: "skip",
		verdict.ExpectedFail: "fail", verdict.UnexpectedPass: "pass",
	}[status]
	return &verdict.Test{Package: testPkg, Name: name, Kind: kind, Status: status, Action: action, Elapsed: 0.25, Leaf: true}
}

// parent is a passing test with subtests.
func parent(name string, kind verdict.Kind) *verdict.Test {
	t := leaf(name, kind, verdict.Pass)
	t.Leaf = false
	return t
}

func TestWriteTableCountsKinds(t *testing.T) {
	patched, stock := kindsRuns()
	var b strings.Builder
	WriteTable(&b, patched, stock)
	table, _, _ := strings.Cut(b.String(), "\n\n")
	lines := strings.Split(table, "\n")
	if got, want := strings.Join(strings.Fields(lines[0]), " "),
		"kernel suite fs passed failed proves keeps expected-fail skipped time"; got != want {
		t.Fatalf("header %q, want %q", got, want)
	}
	rows := map[string]string{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) != 10 {
			t.Fatalf("row %q has %d columns, want 10", l, len(f))
		}
		rows[f[0]+" "+f[1]+" "+f[2]] = strings.Join(f[3:9], " ")
	}
	// passed failed proves keeps expected-fail skipped
	want := map[string]string{
		"patched x tmpfs": "3 0 1 1 0 0",
		"patched x ext4":  "1 0 0 1 0 1",
		"stock x tmpfs":   "2 0 0 1 1 0",
		"stock x ext4":    "1 0 0 1 0 1",
	}
	if len(rows) != len(want) {
		t.Errorf("rows %q, want %q", rows, want)
	}
	for k, w := range want {
		if rows[k] != w {
			t.Errorf("%s: %q, want %q\n%s", k, rows[k], w, table)
		}
	}
	// Columns line up: every row is as wide as the header.
	for _, l := range lines[1:] {
		if len(l) != len(lines[0]) {
			t.Errorf("row %q is not as wide as the header %q", l, lines[0])
		}
	}
}

func TestJUnitTellsKindsApart(t *testing.T) {
	patched, stock := kindsRuns()
	b, err := JUnit(patched, stock)
	if err != nil {
		t.Fatal(err)
	}
	var doc junitSuites
	if err := xml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("JUnit does not parse: %v\n%s", err, b)
	}
	got := map[string]string{}
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			got[s.Name+" "+c.Name] = c.Classname
		}
	}
	for k, w := range map[string]string{
		"patched/x TestKeep/tmpfs":  "patched/x.keeps",
		"patched/x TestProof/tmpfs": "patched/x.proves",
		"patched/x TestPlain/tmpfs": "patched/x",
		"stock/x TestKeep/ext4":     "stock/x.keeps",
		"stock/x TestProof/tmpfs":   "stock/x.proves",
	} {
		if got[k] != w {
			t.Errorf("%s: classname %q, want %q", k, got[k], w)
		}
	}
}

func TestJUnitHasFailuresAndProblems(t *testing.T) {
	b, err := JUnit(&verdict.Result{Label: "patched",
		Tests:    []*verdict.Test{leaf("TestA", verdict.Plain, verdict.Fail), leaf("TestB", verdict.Plain, verdict.Pass)},
		Problems: []string{"kernel WARNING report:\nWARNING: CPU: 0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{`name="patched/x"`, `failures="1"`, `name="TestA"`, `name="patched/harness"`, "WARNING: CPU: 0"} {
		if !strings.Contains(s, want) {
			t.Errorf("JUnit lacks %q:\n%s", want, s)
		}
	}
}

// What JUnit writes, ReadJUnit reads back: the same statuses, kinds and
// problems, so a merged report judges as the runs did.
func TestReadJUnitRoundTrip(t *testing.T) {
	patched, stock := kindsRuns()
	stock.Tests = append(stock.Tests, leaf("TestProof/xfs", verdict.Proof, verdict.UnexpectedPass))
	patched.Problems = []string{"kernel WARNING report while TestPlain was running:\nWARNING: at fs/overlayfs/super.c"}
	b, err := JUnit(patched, stock)
	if err != nil {
		t.Fatal(err)
	}
	runs, err := ReadJUnit(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []*verdict.Result{patched, stock} {
		got := runs[want.Label]
		if got == nil {
			t.Fatalf("no run %q in %v", want.Label, runs)
		}
		if !reflect.DeepEqual(got.Problems, want.Problems) {
			t.Errorf("%s: problems %q, want %q", want.Label, got.Problems, want.Problems)
		}
		var leaves []string
		for _, w := range want.Tests {
			if w.Leaf {
				leaves = append(leaves, fmt.Sprintf("%s %s %s", w.Name, w.Kind, w.Status))
			}
		}
		var back []string
		for _, g := range got.Tests {
			back = append(back, fmt.Sprintf("%s %s %s", g.Name, g.Kind, g.Status))
		}
		if !reflect.DeepEqual(back, leaves) {
			t.Errorf("%s: read back\n%q\nwant\n%q", want.Label, back, leaves)
		}
	}
	if _, err := ReadJUnit([]byte("<testsuites><testsuite name=\"nolabel\"></testsuite></testsuites>")); err == nil {
		t.Error("a suite not named LABEL/SUITE was accepted")
	}
}
