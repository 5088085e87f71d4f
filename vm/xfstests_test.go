package vm

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A report as xfstests' common/report writes it, with a pass, a not-run
// test and a failure carrying the diff, the kernel log and .full.
const sampleXunit = `<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="xfstests" failures="1" skipped="1" tests="3" time="40" hostname="ovlkit-xfstests">
	<properties>
		<property name="FSTYP" value="overlay"/>
	</properties>
	<testcase classname="xfstests.global" name="overlay/001" time="3">
	</testcase>
	<testcase classname="xfstests.global" name="generic/002" time="0">
		<skipped message="this test requires a valid $SCRATCH_DEV" />
	</testcase>
	<testcase classname="xfstests.global" name="overlay/010" time="5">
		<failure message="- output mismatch (see /opt/xfstests/results//overlay/010.out.bad)" type="TestFail" />
		<system-out>
<![CDATA[
full output
]]>
		</system-out>
		<kernel-log>
<![CDATA[
[   12.3] overlayfs: failed
]]>
		</kernel-log>
		<system-err>
<![CDATA[
--- tests/overlay/010.out
+++ /opt/xfstests/results//overlay/010.out.bad
-Silence is golden
]]>
		</system-err>
	</testcase>
</testsuite>
`

func TestParseXfstestsXunit(t *testing.T) {
	tests, err := parseXfstestsXunit([]byte(sampleXunit))
	if err != nil {
		t.Fatal(err)
	}
	if len(tests) != 3 {
		t.Fatalf("got %d tests, want 3: %+v", len(tests), tests)
	}
	want := map[string]XfsStatus{"overlay/001": XfsPass, "generic/002": XfsNotRun, "overlay/010": XfsFail}
	for _, tc := range tests {
		if tc.Status != want[tc.Name] {
			t.Errorf("%s: status %s, want %s", tc.Name, tc.Status, want[tc.Name])
		}
	}
	fail := tests[2]
	if fail.Name != "overlay/010" || !strings.Contains(fail.Message, "output mismatch") {
		t.Errorf("failure %+v lacks its message", fail)
	}
	// The diff comes before the kernel log and .full.
	d, k, f := strings.Index(fail.Output, "-Silence"), strings.Index(fail.Output, "overlayfs: failed"), strings.Index(fail.Output, "full output")
	if d < 0 || k < 0 || f < 0 || !(d < k && k < f) {
		t.Errorf("failure output out of order or incomplete:\n%s", fail.Output)
	}
	if tests[0].Message != "this test requires a valid $SCRATCH_DEV" {
		t.Errorf("not-run reason %q", tests[0].Message)
	}
}

func TestLoadXfstests(t *testing.T) {
	dir := t.TempDir()
	serial := "ovlkit-xfstests: kernel 6.12.118, xfstests 63a29724, base xfs\noverlay/001 3s\n"
	if err := os.WriteFile(filepath.Join(dir, "serial.log"), []byte(serial), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "results"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results", "result.xml"), []byte(sampleXunit), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := LoadXfstests("patched", "xfs", dir)
	if err != nil {
		t.Fatal(err)
	}
	if res.Uname != "6.12.118" || res.Commit != "63a29724" || res.Label != "patched" || res.FS != "xfs" {
		t.Errorf("run read as %q %q %q %q", res.Label, res.FS, res.Uname, res.Commit)
	}
	if p, f, n := res.Counts(); p != 1 || f != 1 || n != 1 {
		t.Errorf("counts %d passed, %d failed, %d not run; want 1, 1, 1", p, f, n)
	}
	if len(res.Problems) != 0 {
		t.Errorf("problems in a complete run: %q", res.Problems)
	}

	// A run whose results never came back is judged from its console,
	// and says so.
	if err := os.RemoveAll(filepath.Join(dir, "results")); err != nil {
		t.Fatal(err)
	}
	res, err = LoadXfstests("patched", "xfs", dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Tests) != 1 || res.Tests[0].Name != "overlay/001" || len(res.Problems) != 2 {
		t.Errorf("console-only run read as %+v, problems %q", res.Tests, res.Problems)
	}

	if _, err := LoadXfstests("stock", "xfs", filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing run directory was read without an error")
	}
}

// A baseline given only what the other kernel did not pass: the tests it
// was not given are not differences, and a test it passes that fails on
// the other kernel is still a regression.
func TestCompareXfstestsSubset(t *testing.T) {
	patched := &XfstestsResult{Label: "patched", Tests: []XfsTest{
		{Name: "generic/001", Status: XfsPass},
		{Name: "generic/002", Status: XfsFail},
		{Name: "generic/003", Status: XfsNotRun},
		{Name: "generic/004", Status: XfsFail},
	}}
	rerun := NotPassed(patched)
	if strings.Join(rerun, ",") != "generic/002,generic/003,generic/004" {
		t.Fatalf("NotPassed = %v", rerun)
	}
	stock := &XfstestsResult{Label: "stock", Subset: true, Tests: []XfsTest{
		{Name: "generic/002", Status: XfsPass},
		{Name: "generic/003", Status: XfsNotRun},
		{Name: "generic/004", Status: XfsFail},
	}}
	diffs := CompareXfstests(stock, patched)
	if len(diffs) != 1 || diffs[0].Name != "generic/002" || !diffs[0].Regression {
		t.Fatalf("diffs %+v, want only generic/002 as a regression", diffs)
	}
	stock.Subset = false
	if n := len(CompareXfstests(stock, patched)); n != 2 {
		t.Errorf("a full baseline missing generic/001 gave %d differences, want 2", n)
	}
}

func TestNotPassedAcrossRuns(t *testing.T) {
	a := &XfstestsResult{Tests: []XfsTest{{Name: "overlay/001", Status: XfsPass}, {Name: "overlay/002", Status: XfsPass}}}
	b := &XfstestsResult{Tests: []XfsTest{{Name: "overlay/001", Status: XfsPass}}}
	// overlay/002 is missing from b (its guest died): it is retried.
	if got := NotPassed(a, b); len(got) != 1 || got[0] != "overlay/002" {
		t.Errorf("NotPassed = %v, want [overlay/002]", got)
	}
	if got := NotPassed(a); len(got) != 0 {
		t.Errorf("NotPassed of a clean run = %v", got)
	}
}

func TestParseCheckConsole(t *testing.T) {
	console := strings.Split(`FSTYP         -- overlay
overlay/001 3s ...  2s
generic/047         676s
overlay/002       [not run] this test requires a valid $SCRATCH_DEV
generic/003 1s ... - output mismatch (see /opt/xfstests/results//generic/003.out.bad)
    --- tests/generic/003.out
    +++ /opt/xfstests/results//generic/003.out.bad
    @@ -1 +1 @@
generic/004 [failed, exit status 1]- output mismatch (see /opt/xfstests/results//generic/004.out.bad)
generic/005       [expunged]
Ran: overlay/001 generic/003 generic/004`, "\n")
	got := map[string]XfsTest{}
	for _, tc := range parseCheckConsole(console) {
		got[tc.Name] = tc
	}
	want := map[string]XfsStatus{"overlay/001": XfsPass, "generic/047": XfsPass, "overlay/002": XfsNotRun,
		"generic/003": XfsFail, "generic/004": XfsFail, "generic/005": XfsNotRun}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for n, s := range want {
		if got[n].Status != s {
			t.Errorf("%s: %s, want %s", n, got[n].Status, s)
		}
	}
	// The time of this run, not the previous one check prints first.
	if got["overlay/001"].Seconds != 2 || got["generic/047"].Seconds != 676 {
		t.Errorf("times %v and %v, want 2 and 676", got["overlay/001"].Seconds, got["generic/047"].Seconds)
	}
	if !strings.Contains(got["generic/003"].Output, "+++ /opt/xfstests/results//generic/003.out.bad") {
		t.Errorf("generic/003 output %q lacks the diff", got["generic/003"].Output)
	}
}

func TestCompareXfstests(t *testing.T) {
	stock := &XfstestsResult{Label: "stock", Tests: []XfsTest{
		{Name: "overlay/001", Status: XfsPass},
		{Name: "overlay/002", Status: XfsPass},
		{Name: "overlay/003", Status: XfsFail},
		{Name: "overlay/004", Status: XfsNotRun},
		{Name: "overlay/005", Status: XfsPass},
		{Name: "overlay/006", Status: XfsFail},
	}}
	patched := &XfstestsResult{Label: "patched", Tests: []XfsTest{
		{Name: "overlay/001", Status: XfsPass},
		{Name: "overlay/002", Status: XfsFail},
		{Name: "overlay/003", Status: XfsPass},
		{Name: "overlay/004", Status: XfsPass},
		// overlay/005 is missing: the guest died before it.
		{Name: "overlay/006", Status: XfsFail},
	}}
	diffs := CompareXfstests(stock, patched)
	kinds := map[string]string{}
	for _, d := range diffs {
		switch {
		case d.Regression:
			kinds[d.Name] = "regression"
		case d.Fix:
			kinds[d.Name] = "fix"
		case d.NotRunChange:
			kinds[d.Name] = "notrun"
		}
	}
	want := map[string]string{"overlay/002": "regression", "overlay/003": "fix",
		"overlay/004": "notrun", "overlay/005": "regression"}
	if len(kinds) != len(want) {
		t.Fatalf("diffs %v, want %v", kinds, want)
	}
	for n, k := range want {
		if kinds[n] != k {
			t.Errorf("%s: %q, want %q", n, kinds[n], k)
		}
	}
}

func TestWriteXfstestsReports(t *testing.T) {
	runs := []*XfstestsResult{
		{Label: "stock", FS: "ext4", Tests: []XfsTest{{Name: "overlay/001", Status: XfsPass, Seconds: 2},
			{Name: "overlay/002", Status: XfsNotRun, Message: "no fsck.overlay"}}},
		{Label: "patched", FS: "ext4", Tests: []XfsTest{{Name: "overlay/001", Status: XfsFail, Message: "output mismatch"},
			{Name: "overlay/002", Status: XfsNotRun, Message: "no fsck.overlay"}},
			Problems: []string{"kernel WARNING report:\nWARNING: at fs/overlayfs"}},
	}
	var b bytes.Buffer
	WriteXfstestsTable(&b, runs...)
	for _, s := range []string{"stock (ext4)", "patched (ext4)", "overlay/001", "pass 2s", "fail",
		"overlay/001\n   - patched: fail: ``output mismatch``\n",
		"overlay/002\n   - stock, patched: notrun: ``no fsck.overlay``\n"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, b.String())
		}
	}
	path := filepath.Join(t.TempDir(), "junit.xml")
	if err := WriteXfstestsJUnit(path, runs...); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Suites []struct {
			Name     string `xml:"name,attr"`
			Failures int    `xml:"failures,attr"`
			Tests    int    `xml:"tests,attr"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Suites) != 2 || doc.Suites[0].Failures != 0 || doc.Suites[1].Failures != 2 || doc.Suites[1].Tests != 3 {
		t.Errorf("JUnit suites %+v: want stock clean, patched with the failing test and the run problem", doc.Suites)
	}
}

// TestXfstestsScope runs the guest's systemd-run and systemctl stand-ins
// (xfstests_scope.sh) the way check does: its probe must see the exit
// status, and stopping a test's scope must kill what the test left
// running in the background, as overlay/058 does.
func TestXfstestsScope(t *testing.T) {
	for _, tool := range []string{"bash", "setsid", "pkill", "ps"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed to run the guest's scope.sh: %v", tool, err)
		}
	}
	bin := t.TempDir()
	scopes := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "systemd-run"), xfstestsScope, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, link := range []string{"systemctl", "systemd-escape"} {
		if err := os.Symlink("systemd-run", filepath.Join(bin, link)); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), "OVLKIT_SCOPE_DIR="+scopes, "PATH="+bin+":"+os.Getenv("PATH"))
	run := func(name string, args ...string) (int, string) {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return 0, string(out)
		case errors.As(err, &ee):
			return ee.ExitCode(), string(out)
		}
		t.Fatalf("%s %v: %v", name, args, err)
		return -1, ""
	}

	// check's probe: HAVE_SYSTEMD_SCOPES is set only on exit status 77.
	if rc, out := run("systemctl", "reset-failed", "fstests-check"); rc != 0 {
		t.Errorf("systemctl reset-failed: exit %d: %s", rc, out)
	}
	if rc, out := run("systemd-run", "--quiet", "--unit", "fstests-check", "--scope", "bash", "-c", "exit 77"); rc != 77 {
		t.Errorf("probe: exit %d, want 77: %s", rc, out)
	}

	// A test that leaves a process behind, like overlay/058's backgrounded
	// open_by_handle -s, whose parent shell alone is killed, run by the
	// scope part of check's _run_seq (xfstests 63a29724a85f). Whatever
	// the stand-ins print lands in the test's output and fails it.
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	// Its output goes elsewhere, or the pipe would stay open as long as
	// it runs.
	test := `f() { sleep 300 & echo $! >"$1.tmp"; mv "$1.tmp" "$1"; wait; }
f "$1" >/dev/null 2>&1 &
while [ ! -e "$1" ]; do sleep 0.05; done
exit 3`
	if err := os.MkdirAll(filepath.Join(dir, "overlay"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "overlay", "058"), []byte("#!/bin/bash\n"+test+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	runSeq := `seq=overlay/058
local_unit="$(systemd-escape "fs$seq").scope"
systemctl reset-failed "${local_unit}" &> /dev/null
systemd-run --quiet --unit "${local_unit}" --scope bash -c "exec ./$seq $1"
res=$?
systemctl stop "${local_unit}" &> /dev/null
exit $res`
	cmd := exec.Command("bash", "-c", runSeq, "check", pidFile)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("check's _run_seq: %v, want the test's exit status 3: %s", err, out)
	}
	if len(out) > 0 {
		t.Errorf("check's _run_seq printed %q: it would be in the test's output", out)
	}
	unit := "fsoverlay-058.scope"
	var b []byte
	for i := 0; i < 100; i++ {
		if b, err = os.ReadFile(pidFile); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("the test's background process never started: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("pid file: %v", err)
	}
	// The sleep is the child of the function's subshell, not of the test:
	// killing the test's children alone would leave it.
	alive := func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		_, rest, _ := strings.Cut(string(stat), ") ")
		return !strings.HasPrefix(rest, "Z")
	}
	t.Cleanup(func() {
		if alive() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if alive() {
		t.Errorf("process %d the test left behind still runs after systemctl stop", pid)
	}
	if _, err := os.Stat(filepath.Join(scopes, unit)); !os.IsNotExist(err) {
		t.Errorf("scope record %s left after stop: %v", unit, err)
	}

	// The same test, its scope not stopped: what it leaves keeps running,
	// so the check above proves the stop.
	if rc, out := run("systemd-run", "--quiet", "--unit", unit, "--scope", "bash", "-c", test, "test", pidFile+"2"); rc != 3 {
		t.Fatalf("test in a scope: exit %d, want the test's 3: %s", rc, out)
	}
	for i := 0; i < 100; i++ {
		if b, err = os.ReadFile(pidFile + "2"); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		t.Fatalf("pid file: %v", err)
	}
	if !alive() {
		t.Errorf("process %d the test left behind is gone before its scope was stopped", pid)
	}
	if rc, out := run("systemctl", "stop", unit); rc != 0 || alive() {
		t.Errorf("systemctl stop: exit %d, process %d alive %v: %s", rc, pid, alive(), out)
	}
	if _, esc := run("systemd-escape", "a-b/c"); esc != "a\\x2db-c\n" {
		t.Errorf("systemd-escape a-b/c = %q, want systemd's a\\x2db-c", esc)
	}

	// What check does not use fails, so tests that need systemd stay not run.
	if rc, _ := run("systemctl", "show-environment"); rc == 0 {
		t.Error("systemctl show-environment succeeded: tests would take the guest for a systemd system")
	}
	if rc, _ := run("systemd-run", "--unit", "x", "true"); rc == 0 {
		t.Error("systemd-run without --scope succeeded")
	}
}

// sitting writes one sitting's console (and, when finished, check's
// report) as RunXfstests leaves it, and reads it back.
func sitting(t *testing.T, label string, given []string, consoleTests string, report string) *XfstestsResult {
	t.Helper()
	dir := t.TempDir()
	serial := "ovlkit-xfstests: kernel 6.12.118, xfstests 63a29724, base ext4\n" +
		"ovlkit-xfstests: ./check -overlay -R xunit " + strings.Join(given, " ") + "\n" + consoleTests
	if err := os.WriteFile(filepath.Join(dir, "serial.log"), []byte(serial), 0o644); err != nil {
		t.Fatal(err)
	}
	if report != "" {
		if err := os.MkdirAll(filepath.Join(dir, "results"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "results", "result.xml"), []byte(report), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r, err := LoadXfstests(label, "ext4", dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestMergeXfstestsSittings(t *testing.T) {
	// The first sitting was stopped during generic/003; the second ran
	// it and the rest of the part, and generic/002 again.
	stopped := sitting(t, "patched", []string{"generic/001", "generic/002", "generic/003", "generic/004"},
		"generic/001 3s ...  3s\ngeneric/002 - output mismatch (see results/generic/002.out.bad)\n", "")
	if !stopped.Unfinished || len(stopped.Given) != 4 || len(stopped.Problems) != 2 {
		t.Fatalf("stopped sitting read as unfinished %v, given %q, problems %q", stopped.Unfinished, stopped.Given, stopped.Problems)
	}
	rest := `<testsuite name="xfstests" tests="3">
	<testcase name="generic/002" time="4"></testcase>
	<testcase name="generic/003" time="5"></testcase>
	<testcase name="generic/004" time="0"><skipped message="no O_TMPFILE"/></testcase>
</testsuite>`
	later := sitting(t, "patched", []string{"generic/002", "generic/003", "generic/004"}, "", rest)
	m, err := MergeXfstests(stopped, later)
	if err != nil {
		t.Fatal(err)
	}
	if p, f, n := m.Counts(); p != 3 || f != 0 || n != 1 {
		t.Errorf("merged counts %d passed, %d failed, %d not run; want 3, 0, 1 (a later result replaces an earlier one)", p, f, n)
	}
	if len(m.Problems) != 0 || m.Unfinished {
		t.Errorf("sittings that cover every given test keep problems %q (unfinished %v)", m.Problems, m.Unfinished)
	}
	if m.Uname != "6.12.118" || m.Commit != "63a29724" || len(m.Given) != 4 || !strings.Contains(m.Serial, later.Serial) {
		t.Errorf("merged run %q %q, given %q, serial %q", m.Uname, m.Commit, m.Given, m.Serial)
	}

	// Without the later sitting's generic/004 the stopped sitting's
	// problems stand, and the test without a result is named.
	partial := sitting(t, "patched", []string{"generic/003"}, "generic/003 5s ...  5s\n", `<testsuite name="xfstests" tests="1">
	<testcase name="generic/003" time="5"></testcase>
</testsuite>`)
	m, err = MergeXfstests(stopped, partial)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Unfinished || len(m.Problems) != 3 || !strings.Contains(m.Problems[2], "generic/004") {
		t.Errorf("a test no sitting finished is not reported: unfinished %v, problems %q", m.Unfinished, m.Problems)
	}

	// A sitting stopped before its first test ended adds nothing, and
	// once a later one has run its tests it leaves no problem either.
	early := sitting(t, "patched", []string{"generic/003"}, "", "")
	if len(early.Problems) != 3 {
		t.Fatalf("sitting stopped before a test ended: problems %q", early.Problems)
	}
	if m, err = MergeXfstests(early, partial); err != nil || len(m.Problems) != 0 || len(m.Tests) != 1 {
		t.Errorf("early-stopped sitting merged: err %v, tests %+v, problems %q", err, m.Tests, m.Problems)
	}

	// Different xfstests commits, or kernels, are a problem; another
	// kernel's or filesystem's sitting is an error.
	other := sitting(t, "patched", []string{"generic/004"}, "", rest)
	other.Commit = "0123abcd"
	if m, err = MergeXfstests(later, other); err != nil || len(m.Problems) != 1 {
		t.Errorf("sittings of two xfstests commits: err %v, problems %q", err, m.Problems)
	}
	if _, err := MergeXfstests(later, sitting(t, "stock", nil, "", rest)); err == nil {
		t.Error("sittings of two kernels were merged")
	}
	if _, err := MergeXfstests(); err == nil {
		t.Error("no sittings merged without an error")
	}
}
