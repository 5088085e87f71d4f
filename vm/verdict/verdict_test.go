package verdict

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ovlkit/ovlkit/vm/guestproto"
)

func TestFindSplats(t *testing.T) {
	log := []string{
		"[    1.0] ok",
		"[    2.0] ------------[ cut here ]------------",
		"[    2.0] WARNING: CPU: 0 PID: 77 at drivers/misc/lkdtm/bugs.c:91 lkdtm_WARNING+0x10/0x20",
		"[    2.0] Call Trace:",
		"[    2.0] ---[ end trace 0000000000000000 ]---",
		"[    3.0] later line",
		"[    4.0] BUG: kernel NULL pointer dereference, address: 0000000000000000",
		"[    4.0] Kernel panic - not syncing: Fatal exception",
	}
	s := FindSplats(log)
	if len(s) != 2 {
		t.Fatalf("got %d splats, want 2: %+v", len(s), s)
	}
	if s[0].Kind != "WARNING" || len(s[0].Excerpt) != 3 {
		t.Errorf("first splat %+v", s[0])
	}
	if s[1].Kind != "BUG" {
		t.Errorf("second splat kind %q", s[1].Kind)
	}
	if got := FindSplats([]string{"overlayfs: warning: upper fs does not support RENAME_WHITEOUT."}); len(got) != 0 {
		t.Errorf("an overlayfs pr_warn is not a splat: %+v", got)
	}
	if got := FindSplats([]string{"WARNING: possible circular locking dependency detected"}); len(got) != 1 || got[0].Kind != "lockdep" {
		t.Errorf("lockdep report: %+v", got)
	}
}

func events(pkg string, lines ...string) []Event {
	var evs []Event
	for _, l := range lines {
		f := strings.SplitN(l, " ", 3)
		e := Event{Package: pkg, Action: f[0], Test: f[1]}
		if len(f) == 3 {
			e.Output = f[2]
		}
		evs = append(evs, e)
	}
	return evs
}

func TestJudgeProofs(t *testing.T) {
	evs := events("m/tests/guest/x",
		"output TestProof/tmpfs "+guestproto.ProofMarker+"ovl: fix it\n",
		"fail TestProof/tmpfs",
		"fail TestProof",
		"pass TestPlain",
		"output TestLazyProof "+guestproto.ProofMarker+"ovl: fix it\n",
		"pass TestLazyProof",
		"fail TestBroken",
	)
	for _, stock := range []bool{true, false} {
		tests := collectTests(evs)
		judgeTests(tests, stock)
		got := map[string]Status{}
		for _, tt := range tests {
			got[tt.Name] = tt.Status
		}
		want := map[string]Status{
			"TestProof/tmpfs": Fail, "TestProof": Fail, "TestPlain": Pass,
			"TestLazyProof": Pass, "TestBroken": Fail,
		}
		if stock {
			want["TestProof/tmpfs"] = ExpectedFail
			want["TestProof"] = ExpectedFail
			want["TestLazyProof"] = UnexpectedPass
		}
		for name, w := range want {
			if got[name] != w {
				t.Errorf("stock=%v %s: %s, want %s", stock, name, got[name], w)
			}
		}
	}
}

func TestCollectMarkersAndInheritance(t *testing.T) {
	tests := collectTests(events("m/tests/guest/x",
		"output TestKeep     keep_test.go:12: "+guestproto.KeepsMarker+"rename of a lower dir is EXDEV\n",
		"pass TestKeep/tmpfs",
		"pass TestKeep/ext4",
		"pass TestKeep",
		"output TestMixed/strict     mixed_test.go:30: "+guestproto.ProofMarker+"ovl: fix it\n",
		"pass TestMixed/strict",
		"output TestMixed/default     mixed_test.go:40: "+guestproto.KeepsMarker+"default mount unchanged\n",
		"pass TestMixed/default/xfs",
		"pass TestMixed/default",
		"pass TestMixed",
		"pass TestPlain",
	))
	if problems := judgeTests(tests, false); len(problems) != 0 {
		t.Errorf("problems %q", problems)
	}
	byName := map[string]*Test{}
	for _, tt := range tests {
		byName[tt.Name] = tt
	}
	if k := byName["TestKeep"].Keeps; len(k) != 1 || k[0] != "rename of a lower dir is EXDEV" {
		t.Errorf("TestKeep keeps %q", k)
	}
	if p := byName["TestMixed/strict"].Proves; len(p) != 1 || p[0] != "ovl: fix it" {
		t.Errorf("TestMixed/strict proves %q", p)
	}
	for name, want := range map[string]Kind{
		"TestKeep": Kept, "TestKeep/tmpfs": Kept, "TestKeep/ext4": Kept,
		"TestMixed": Plain, "TestMixed/strict": Proof,
		"TestMixed/default": Kept, "TestMixed/default/xfs": Kept,
		"TestPlain": Plain,
	} {
		if got := byName[name].Kind; got != want {
			t.Errorf("%s: kind %q, want %q", name, got, want)
		}
	}
	if len(byName["TestKeep/ext4"].Keeps) != 0 {
		t.Error("a subtest records its parent's declaration as its own")
	}
}

func TestJudgeKeeps(t *testing.T) {
	evs := events("m/tests/guest/x",
		"output TestKeep "+guestproto.KeepsMarker+"stock behaviour\n",
		"fail TestKeep/tmpfs",
		"pass TestKeep/ext4",
		"fail TestKeep",
		// A keeps subtest inside a proof: the proof's own failure is
		// expected on stock, the keeps subtest's is not, and neither is
		// the proof's, which the keeps failure is part of.
		"output TestProof "+guestproto.ProofMarker+"ovl: fix it\n",
		"fail TestProof/new",
		"output TestProof/old "+guestproto.KeepsMarker+"old behaviour\n",
		"fail TestProof/old",
		"fail TestProof",
		"output TestProofOK "+guestproto.ProofMarker+"ovl: fix it\n",
		"fail TestProofOK/new",
		"output TestProofOK/old "+guestproto.KeepsMarker+"old behaviour\n",
		"pass TestProofOK/old",
		"fail TestProofOK",
		"output TestKeepPasses "+guestproto.KeepsMarker+"stock behaviour\n",
		"pass TestKeepPasses",
	)
	for _, stock := range []bool{true, false} {
		tests := collectTests(evs)
		if problems := judgeTests(tests, stock); len(problems) != 0 {
			t.Errorf("stock=%v: problems %q", stock, problems)
		}
		got := map[string]Status{}
		for _, tt := range tests {
			got[tt.Name] = tt.Status
		}
		want := map[string]Status{
			"TestKeep/tmpfs": Fail, "TestKeep/ext4": Pass, "TestKeep": Fail,
			"TestProof/new": Fail, "TestProof/old": Fail, "TestProof": Fail,
			"TestProofOK/new": Fail, "TestProofOK/old": Pass, "TestProofOK": Fail,
			"TestKeepPasses": Pass,
		}
		if stock {
			want["TestProof/new"] = ExpectedFail
			want["TestProofOK/new"] = ExpectedFail
			want["TestProofOK"] = ExpectedFail
		}
		for name, w := range want {
			if got[name] != w {
				t.Errorf("stock=%v %s: %s, want %s", stock, name, got[name], w)
			}
		}
		if (&Result{Tests: tests}).OK() {
			t.Errorf("stock=%v: a run with failing keeps tests is OK", stock)
		}
	}
}

func TestJudgeContradictoryDeclarations(t *testing.T) {
	tests := collectTests(events("m/tests/guest/x",
		"output TestBoth "+guestproto.ProofMarker+"ovl: fix it\n",
		"output TestBoth "+guestproto.KeepsMarker+"stock behaviour\n",
		"fail TestBoth",
		"output TestOuter "+guestproto.KeepsMarker+"stock behaviour\n",
		"output TestOuter/inner "+guestproto.ProofMarker+"ovl: fix it\n",
		"fail TestOuter/inner",
		"fail TestOuter",
		"output TestFine "+guestproto.ProofMarker+"ovl: fix it\n",
		"fail TestFine",
	))
	problems := judgeTests(tests, true)
	if len(problems) != 2 ||
		!strings.Contains(problems[0], "TestBoth") || !strings.Contains(problems[0], "both") ||
		!strings.Contains(problems[1], "TestOuter/inner") || !strings.Contains(problems[1], "inside TestOuter") {
		t.Fatalf("problems %q", problems)
	}
	for _, tt := range tests {
		// TestBoth counts as a keeps test, so its failure on stock is
		// not excused; TestOuter keeps, so the failing proof inside it
		// makes it fail.
		want := map[string]Status{"TestBoth": Fail, "TestOuter": Fail, "TestOuter/inner": ExpectedFail, "TestFine": ExpectedFail}[tt.Name]
		if tt.Status != want {
			t.Errorf("%s: %s, want %s", tt.Name, tt.Status, want)
		}
	}
	r := ResultFromEvents("host", events("m/x", "output TestBoth "+guestproto.ProofMarker+"s\n", "output TestBoth "+guestproto.KeepsMarker+"k\n", "pass TestBoth"))
	if r.OK() || len(r.Problems) != 1 {
		t.Errorf("ResultFromEvents drops the declaration problem: %q", r.Problems)
	}
}

func judged(label string, stock bool, evs []Event) *Result {
	r := &Result{Label: label, Tests: collectTests(evs)}
	r.Problems = judgeTests(r.Tests, stock)
	return r
}

func TestCompareRuns(t *testing.T) {
	const pkg = "m/tests/guest/x"
	patched := judged("patched", false, events(pkg,
		"output TestKeep "+guestproto.KeepsMarker+"stock behaviour\n",
		"pass TestKeep/tmpfs",
		"pass TestKeep/ext4",
		"pass TestKeep",
		"output TestProof "+guestproto.ProofMarker+"ovl: fix it\n",
		"pass TestProof/tmpfs",
		"pass TestProof/ext4",
		"pass TestProof",
		"output TestEarly "+guestproto.ProofMarker+"ovl: fix it\n",
		"pass TestEarly/tmpfs",
		"pass TestEarly",
		"output TestSkipped "+guestproto.KeepsMarker+"stock behaviour\n",
		"pass TestSkipped",
		"pass TestPlainOnlyHere",
	))
	stock := judged("stock", true, events(pkg,
		"output TestKeep "+guestproto.KeepsMarker+"stock behaviour\n",
		"pass TestKeep/tmpfs",
		"pass TestKeep",
		"output TestProof "+guestproto.ProofMarker+"ovl: fix it\n",
		"fail TestProof/tmpfs",
		"fail TestProof",
		// Fails before its subtests start: judged on its own.
		"output TestEarly "+guestproto.ProofMarker+"ovl: fix it\n",
		"fail TestEarly",
		"output TestSkipped "+guestproto.KeepsMarker+"stock behaviour\n",
		"skip TestSkipped",
		"output TestOnlyStock "+guestproto.KeepsMarker+"stock behaviour\n",
		"pass TestOnlyStock",
	))
	CompareRuns(patched, stock)
	if len(stock.Problems) != 1 || len(patched.Problems) != 1 {
		t.Fatalf("problems: stock %q, patched %q", stock.Problems, patched.Problems)
	}
	s := stock.Problems[0]
	for _, want := range []string{"x: ", "ran on patched did not run on stock", "keeps test TestKeep/ext4: did not run",
		"proves test TestProof/ext4: did not run", "keeps test TestSkipped: skipped"} {
		if !strings.Contains(s, want) {
			t.Errorf("stock problem lacks %q:\n%s", want, s)
		}
	}
	for _, unwanted := range []string{"TestEarly", "TestPlainOnlyHere", "TestKeep/tmpfs"} {
		if strings.Contains(s, unwanted) {
			t.Errorf("stock problem names %s:\n%s", unwanted, s)
		}
	}
	if p := patched.Problems[0]; !strings.Contains(p, "ran on stock did not run on patched") ||
		!strings.Contains(p, "keeps test TestOnlyStock: did not run") || strings.Count(p, "\n") != 1 {
		t.Errorf("patched problem:\n%s", p)
	}
	if stock.OK() || patched.OK() {
		t.Error("runs that miss each other's tests are OK")
	}
}

func TestSummarizeCountsLeavesPerFS(t *testing.T) {
	evs := events("m/tests/guest/sem",
		"pass TestA/tmpfs", "pass TestA/ext4", "fail TestA/xfs", "fail TestA", "pass TestB")
	tests := collectTests(evs)
	judgeTests(tests, false)
	rows := Summarize(tests)
	byFS := map[string]Row{}
	for _, r := range rows {
		if r.Suite != "sem" {
			t.Errorf("suite %q, want sem", r.Suite)
		}
		byFS[r.FS] = r
	}
	if byFS["tmpfs"].Passed != 1 || byFS["xfs"].Failed != 1 || byFS["-"].Passed != 1 {
		t.Errorf("rows %+v", rows)
	}
	res := &Result{Label: "k", Tests: tests}
	if res.OK() {
		t.Error("a run with a failing test is OK")
	}
}

func TestSeriesSubjectsAndCheckProofs(t *testing.T) {
	dir := t.TempDir()
	patch := "From 0 Mon Sep 17 00:00:00 2001\nSubject: [PATCH 1/2] ovl: do a long thing that\n wraps\n\nbody\n"
	if err := os.WriteFile(filepath.Join(dir, "0001-x.patch"), []byte(patch), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "series"), []byte("# comment\n0001-x.patch\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	subj, err := SeriesSubjects(dir)
	if err != nil {
		t.Fatal(err)
	}
	if subj["ovl: do a long thing that wraps"] != "0001-x.patch" {
		t.Fatalf("subjects %q", subj)
	}
	r := &Result{Tests: []*Test{
		{Package: "p", Name: "TestGood", Proves: []string{"ovl: do a long thing that wraps"}},
		{Package: "p", Name: "TestTypo", Proves: []string{"ovl: do a long thing"}},
	}}
	r.CheckProofs(subj)
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "TestTypo") {
		t.Errorf("problems %q", r.Problems)
	}
	if err := os.WriteFile(filepath.Join(dir, "series"), []byte("0002-missing.patch\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := SeriesSubjects(dir); err == nil {
		t.Error("a series naming a missing patch is accepted")
	}
}

func TestJudgeBenchmarks(t *testing.T) {
	tests := collectTests(events("m/tests/guest/b",
		"output BenchmarkRead/1k BenchmarkRead/1k  \t 100\t 12 ns/op\n",
		"output BenchmarkBroken --- FAIL: BenchmarkBroken\n",
		"fail BenchmarkBroken"))
	judgeTests(tests, false)
	for _, tt := range tests {
		want := Pass
		if tt.Name == "BenchmarkBroken" {
			want = Fail
		}
		if tt.Status != want {
			t.Errorf("%s: %s, want %s", tt.Name, tt.Status, want)
		}
	}
}

// writeSeries makes dir/<base>/series listing one patch per subject.
func writeSeries(t *testing.T, dir, base string, subjects ...string) {
	t.Helper()
	d := filepath.Join(dir, base)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	series := "# series of " + base + "\n"
	for i, s := range subjects {
		name := fmt.Sprintf("%04d-p.patch", i+1)
		patch := fmt.Sprintf("From 0 Mon Sep 17 00:00:00 2001\nSubject: [PATCH %d/%d] %s\n\nbody\n", i+1, len(subjects), s)
		if err := os.WriteFile(filepath.Join(d, name), []byte(patch), 0o644); err != nil {
			t.Fatal(err)
		}
		series += name + "\n"
	}
	if err := os.WriteFile(filepath.Join(d, "series"), []byte(series), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadProofScope(t *testing.T) {
	dir := t.TempDir()
	writeSeries(t, dir, "6.1", "ovl: only old", "ovl: both")
	writeSeries(t, dir, "6.12", "ovl: both", "ovl: only new")
	writeSeries(t, dir, "6.13") // an empty series: a comment line only

	s, err := LoadProofScope(dir, "6.12")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Subjects) != 2 || s.Subjects["ovl: only new"] == "" || s.Subjects["ovl: both"] == "" {
		t.Errorf("6.12 subjects %q", s.Subjects)
	}
	if got := s.Elsewhere["ovl: only old"]; len(got) != 1 || got[0] != "6.1" {
		t.Errorf("elsewhere of \"ovl: only old\" = %q, want [6.1]", got)
	}
	if _, ok := s.Elsewhere["ovl: both"]; ok {
		t.Error("a subject of this base's series counts as elsewhere")
	}

	s, err = LoadProofScope(dir, "6.13")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Subjects) != 0 || len(s.Elsewhere) != 3 {
		t.Errorf("empty series: subjects %q, elsewhere %q", s.Subjects, s.Elsewhere)
	}
	if got := s.Elsewhere["ovl: both"]; len(got) != 2 || got[0] != "6.1" || got[1] != "6.12" {
		t.Errorf("elsewhere of \"ovl: both\" = %q, want [6.1 6.12]", got)
	}

	if _, err := LoadProofScope(dir, "7.0"); err == nil {
		t.Error("a base without a series is accepted")
	}
}

// scopeRun judges the same guest output on one kernel and then scopes its
// proofs to base.
func scopeRun(t *testing.T, dir, base string, stock bool, evs []Event) (*Result, map[string]*Test, []*Test) {
	t.Helper()
	s, err := LoadProofScope(dir, base)
	if err != nil {
		t.Fatal(err)
	}
	r := &Result{Label: "k", Tests: collectTests(evs)}
	r.Problems = judgeTests(r.Tests, stock)
	scoped := r.ScopeProofs(s)
	byName := map[string]*Test{}
	for _, tt := range r.Tests {
		byName[tt.Name] = tt
	}
	return r, byName, scoped
}

func TestScopeProofsOnBaseWithoutThePatch(t *testing.T) {
	dir := t.TempDir()
	writeSeries(t, dir, "6.1", "ovl: only old", "ovl: both")
	writeSeries(t, dir, "6.12", "ovl: both")

	// What both kernels of either base print when the behaviour of "only
	// old" is missing: its proof tests fail, the "both" proof fails too.
	missing := events("m/tests/guest/x",
		"output TestOld "+guestproto.ProofMarker+"ovl: only old\n",
		"fail TestOld/ext4",
		"pass TestOld/xfs",
		"fail TestOld",
		"output TestOldAlready "+guestproto.ProofMarker+"ovl: only old\n",
		"pass TestOldAlready",
		"output TestOldCannot "+guestproto.ProofMarker+"ovl: only old\n",
		"skip TestOldCannot",
		"output TestParent/Old "+guestproto.ProofMarker+"ovl: only old\n",
		"fail TestParent/Old",
		"fail TestParent",
		"output TestBoth "+guestproto.ProofMarker+"ovl: both\n",
		"fail TestBoth",
		"output TestTypo "+guestproto.ProofMarker+"ovl: only od\n",
		"fail TestTypo",
	)

	// Stock 6.12: the proofs of "only old" are keeps tests there, so
	// their failures are failures, not expected; a passing one passes.
	r, got, scoped := scopeRun(t, dir, "6.12", true, missing)
	want := map[string]Status{
		"TestOld/ext4": Fail, "TestOld/xfs": Pass, "TestOld": Fail,
		"TestOldAlready": Pass, "TestOldCannot": Skip,
		"TestParent/Old": Fail, "TestParent": Fail,
		"TestBoth": ExpectedFail, "TestTypo": ExpectedFail,
	}
	for name, w := range want {
		if got[name].Status != w {
			t.Errorf("stock 6.12 %s: %s, want %s", name, got[name].Status, w)
		}
	}
	for _, name := range []string{"TestOld", "TestOld/ext4", "TestOldAlready", "TestOldCannot", "TestParent/Old"} {
		if got[name].Kind != Kept {
			t.Errorf("stock 6.12 %s: kind %q, want keeps", name, got[name].Kind)
		}
	}
	if got["TestBoth"].Kind != Proof {
		t.Errorf("TestBoth: kind %q, want proves", got["TestBoth"].Kind)
	}
	var names []string
	for _, tt := range scoped {
		names = append(names, tt.Name)
		if len(tt.Proves) != 0 || len(tt.Elsewhere) != 1 || tt.Elsewhere[0] != "ovl: only old" ||
			len(tt.Keeps) != 1 || !strings.Contains(tt.Keeps[0], "6.1") {
			t.Errorf("%s after scoping: proves %q, elsewhere %q, keeps %q", tt.Name, tt.Proves, tt.Elsewhere, tt.Keeps)
		}
	}
	if strings.Join(names, ",") != "TestOld,TestOldAlready,TestOldCannot,TestParent/Old" {
		t.Errorf("scoped tests %q", names)
	}
	// The typo is still one, whatever the base.
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "TestTypo") {
		t.Errorf("stock 6.12 problems %q", r.Problems)
	}

	// Patched 6.12: the same keeps tests, judged the same way.
	_, got, _ = scopeRun(t, dir, "6.12", false, missing)
	for name, w := range map[string]Status{"TestOld": Fail, "TestOldAlready": Pass, "TestParent": Fail, "TestBoth": Fail} {
		if got[name].Status != w {
			t.Errorf("patched 6.12 %s: %s, want %s", name, got[name].Status, w)
		}
	}

	// Stock 6.1 has the patch in its series: nothing changes there.
	_, got, scoped = scopeRun(t, dir, "6.1", true, missing)
	if len(scoped) != 0 {
		t.Errorf("6.1 scoped %d tests", len(scoped))
	}
	for name, w := range map[string]Status{"TestOld": ExpectedFail, "TestOldAlready": UnexpectedPass, "TestParent": ExpectedFail} {
		if got[name].Status != w {
			t.Errorf("stock 6.1 %s: %s, want %s", name, got[name].Status, w)
		}
	}
}

func TestScopeProofsSummaryAndContradictions(t *testing.T) {
	dir := t.TempDir()
	writeSeries(t, dir, "6.1", "ovl: only old", "ovl: both")
	writeSeries(t, dir, "6.12", "ovl: both")
	evs := events("m/tests/guest/x",
		"output TestOld "+guestproto.ProofMarker+"ovl: only old\n",
		"pass TestOld/ext4",
		"pass TestOld",
		// A proof of a patch 6.12 has inside one it lacks: on 6.12 the
		// outer test must pass on stock while the inner one must fail.
		"output TestNested "+guestproto.ProofMarker+"ovl: only old\n",
		"output TestNested/Both "+guestproto.ProofMarker+"ovl: both\n",
		"pass TestNested/Both",
		"pass TestNested",
	)
	r, _, _ := scopeRun(t, dir, "6.12", false, evs)
	rows := Summarize(r.Tests)
	keeps, proves := 0, 0
	for _, row := range rows {
		keeps += row.Keeps
		proves += row.Proves
	}
	if keeps != 1 || proves != 1 {
		t.Errorf("keeps %d, proves %d; want 1 (TestOld/ext4) and 1 (TestNested/Both)", keeps, proves)
	}
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "TestNested/Both proves") {
		t.Errorf("problems %q", r.Problems)
	}
	// Scoping twice reports the contradiction once.
	s, err := LoadProofScope(dir, "6.12")
	if err != nil {
		t.Fatal(err)
	}
	r.ScopeProofs(s)
	if len(r.Problems) != 1 {
		t.Errorf("problems after scoping twice %q", r.Problems)
	}
}
