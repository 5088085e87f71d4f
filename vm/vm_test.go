package vm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseGuestStream(t *testing.T) {
	stream := tag + "start 6.1.192 #1\n" +
		tag + "begin example.com/a\n" +
		"=== RUN   TestX\n--- PASS: TestX (0.00s)\nPASS\n" +
		tag + "end example.com/a 0 0.125\n" +
		tag + "begin example.com/b\n" +
		"partial line without newline" + tag + "end example.com/b 1 2.000\n" +
		tag + "kmsg\n[    1.000000] hello\n" + tag + "kmsg-end\n" +
		tag + "done\n"
	g, err := parseGuestStream(strings.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	if g.Kernel != "6.1.192 #1" || !g.Done {
		t.Errorf("kernel %q done %v", g.Kernel, g.Done)
	}
	if len(g.Binaries) != 2 {
		t.Fatalf("got %d binaries, want 2", len(g.Binaries))
	}
	a, b := g.Binaries[0], g.Binaries[1]
	if a.Pkg != "example.com/a" || !a.Ended || a.ExitCode != 0 || a.Seconds != 0.125 {
		t.Errorf("binary a = %+v", a)
	}
	if !strings.Contains(string(a.Output), "--- PASS: TestX") {
		t.Errorf("binary a output %q", a.Output)
	}
	if b.ExitCode != 1 || string(b.Output) != "partial line without newline" {
		t.Errorf("binary b = %+v", b)
	}
	if len(g.Kmsg) != 1 || g.Kmsg[0] != "[    1.000000] hello" {
		t.Errorf("kmsg = %q", g.Kmsg)
	}
}

func TestParseGuestStreamTruncated(t *testing.T) {
	g, err := parseGuestStream(strings.NewReader(tag + "begin p\n=== RUN   TestY\n"))
	if err != nil {
		t.Fatal(err)
	}
	if g.Done || len(g.Binaries) != 1 || g.Binaries[0].Ended {
		t.Errorf("truncated stream parsed as %+v", g)
	}
}

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
		"output TestProof/tmpfs "+proofMarker+"ovl: fix it\n",
		"fail TestProof/tmpfs",
		"fail TestProof",
		"pass TestPlain",
		"output TestLazyProof "+proofMarker+"ovl: fix it\n",
		"pass TestLazyProof",
		"fail TestBroken",
	)
	for _, stock := range []bool{true, false} {
		tests := collectTests(evs)
		judge(tests, stock)
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

func TestSummarizeCountsLeavesPerFS(t *testing.T) {
	evs := events("m/tests/guest/sem",
		"pass TestA/tmpfs", "pass TestA/ext4", "fail TestA/xfs", "fail TestA", "pass TestB")
	tests := collectTests(evs)
	judge(tests, false)
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

func TestJUnitHasFailuresAndProblems(t *testing.T) {
	tests := collectTests(events("m/tests/guest/x", "fail TestA", "pass TestB"))
	judge(tests, false)
	b, err := JUnit(&Result{Label: "patched", Tests: tests, Problems: []string{"kernel WARNING report:\nWARNING: CPU: 0"}})
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

func TestParseGuestStreamCRLF(t *testing.T) {
	g, err := parseGuestStream(strings.NewReader(tag + "begin p\r\n--- PASS: TestZ (1.50s)\r\n" + tag + "end p 0 1.5\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Binaries) != 1 || string(g.Binaries[0].Output) != "--- PASS: TestZ (1.50s)\n" {
		t.Errorf("CR LF not normalised: %+v", g.Binaries)
	}
}

func TestJudgeBenchmarks(t *testing.T) {
	tests := collectTests(events("m/tests/guest/b",
		"output BenchmarkRead/1k BenchmarkRead/1k  \t 100\t 12 ns/op\n",
		"output BenchmarkBroken --- FAIL: BenchmarkBroken\n",
		"fail BenchmarkBroken"))
	judge(tests, false)
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

func TestNestedWorkspace(t *testing.T) {
	top := t.TempDir()
	for _, f := range []string{"go.mod", "bench/go.mod", "bench/go.work", "other/go.mod"} {
		p := filepath.Join(top, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(top, "bench", "cmd", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		patterns []string
		want     string
		err      bool
	}{
		{[]string{"./tests/guest/..."}, "", false},
		{[]string{"./bench"}, filepath.Join(top, "bench", "go.work"), false},
		{[]string{"./bench/..."}, filepath.Join(top, "bench", "go.work"), false},
		{[]string{"./bench/cmd/x", "./tests/guest/graph"}, filepath.Join(top, "bench", "go.work"), false},
		{[]string{"./other"}, "", true},
	} {
		got, err := NestedWorkspace(top, c.patterns)
		if got != c.want || (err != nil) != c.err {
			t.Errorf("%v: %q, %v; want %q, error %v", c.patterns, got, err, c.want, c.err)
		}
	}
}

func TestParseTSCkHz(t *testing.T) {
	vmHost := "processor\t: 0\ncpu MHz\t\t: 2596.134\nflags\t\t: fpu tsc constant_tsc nonstop_tsc tsc_known_freq hypervisor\n" +
		"processor\t: 1\ncpu MHz\t\t: 1200.000\nflags\t\t: fpu\n"
	if khz, ok := parseTSCkHz(vmHost); !ok || khz != 2596134 {
		t.Errorf("VM host: %d %v, want 2596134", khz, ok)
	}
	for name, info := range map[string]string{
		"scaling bare metal": "cpu MHz\t\t: 3400.000\nflags\t\t: tsc constant_tsc nonstop_tsc\n",
		"no frequency":       "flags\t\t: tsc constant_tsc tsc_known_freq hypervisor\n",
		"empty":              "",
	} {
		if khz, ok := parseTSCkHz(info); ok {
			t.Errorf("%s: %d kHz, want none", name, khz)
		}
	}
}
