package cijob

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/ovlkit/ovlkit/vm/initramfs"
	"github.com/ovlkit/ovlkit/vm/report"
	"github.com/ovlkit/ovlkit/vm/verdict"
)

// fakeTree writes a source tree with two bases, a suite run per filesystem,
// one run once, a library package, a nested module, cmd/ovlgraph, and test
// files the go command would not take for a package.
func fakeTree(t *testing.T) string {
	t.Helper()
	top := t.TempDir()
	files := map[string]string{
		"patches/6.1/series":                   "",
		"patches/6.12/series":                  "",
		"tests/guest/perfs/a_test.go":          "package perfs\nfunc TestA(t *testing.T) { guesttest.ForEachFS(t, nil) }\n",
		"tests/guest/perfs/b_test.go":          "package perfs\n",
		"tests/guest/once/once_test.go":        "package once\nfunc TestB(t *testing.T) {}\n",
		"tests/guest/guesttest/guesttest.go":   "package guesttest\nfunc ForEachFS() {}\n",
		"tests/guest/faults/go.mod":            "module example.com/faults\n",
		"tests/guest/faults/m_test.go":         "package faults\nfunc TestM(t *testing.T) { guesttest.ForEachFS(t, nil) }\n",
		"cmd/ovlgraph/main.go":                 "package main\n",
		"cmd/ovlgraph/guest_test.go":           "package main\n",
		"cmd/ovlgraph/sub/ignored_test.go":     "package sub\n",
		"tests/guest/perfs/testdata/x_test.go": "package x\n",
	}
	for name, body := range files {
		p := filepath.Join(top, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return top
}

func jobIDs(jobs []Job) []string {
	var ids []string
	for _, j := range jobs {
		ids = append(ids, j.ID)
	}
	return ids
}

func TestFindSuites(t *testing.T) {
	suites, err := FindSuites(fakeTree(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []Suite{
		{Name: "faults", Package: "./tests/guest/faults", PerFS: true, Module: true},
		{Name: "once", Package: "./tests/guest/once"},
		{Name: "ovlgraph", Package: "./cmd/ovlgraph"},
		{Name: "perfs", Package: "./tests/guest/perfs", PerFS: true},
	}
	if !reflect.DeepEqual(suites, want) {
		t.Errorf("suites:\n got %+v\nwant %+v", suites, want)
	}
}

func TestListJobs(t *testing.T) {
	top := fakeTree(t)
	jobs, err := List(top, "build/jobs", Filter{Bases: []string{"6.12"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"6.12-default-all-once", "6.12-default-all-ovlgraph",
		"6.12-default-tmpfs-perfs", "6.12-default-ext4-perfs", "6.12-default-xfs-perfs", "6.12-default-btrfs-perfs",
		"6.12-debug-tmpfs-faults", "6.12-debug-ext4-faults", "6.12-debug-xfs-faults", "6.12-debug-btrfs-faults",
		"6.12-debug-all-once", "6.12-debug-all-ovlgraph",
		"6.12-debug-tmpfs-perfs", "6.12-debug-ext4-perfs", "6.12-debug-xfs-perfs", "6.12-debug-btrfs-perfs",
		"6.12-distro-all-once", "6.12-distro-all-ovlgraph",
		"6.12-distro-tmpfs-perfs", "6.12-distro-ext4-perfs", "6.12-distro-xfs-perfs", "6.12-distro-btrfs-perfs",
	}
	if got := jobIDs(jobs); !reflect.DeepEqual(got, want) {
		t.Errorf("jobs:\n got %v\nwant %v", got, want)
	}

	all, err := List(top, "build/jobs", Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2*len(want) || all[0].Base != "6.1" {
		t.Errorf("all bases: %d jobs, first %s; want %d, 6.1 first", len(all), all[0].ID, 2*len(want))
	}

	jobs, err = List(top, "out", Filter{Bases: []string{"6.1"}, Configs: []string{"debug"}, FS: []string{"xfs"}, Suites: []string{"faults"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 1 {
		t.Fatalf("one cell: got %v", jobIDs(jobs))
	}
	j := jobs[0]
	wantCmd := "mkdir -p out && KBASE=6.1 KCONFIG_EXTRA=debug go run ./cmd/ovlvm test -kbase 6.1 -pkg ./tests/guest/faults " +
		"-env OVLKIT_FS=xfs -env OVLKIT_LOCKDEP=required -mem 2048 -timeout 300m -test-timeout 300m " +
		"-json out/6.1-debug-xfs-faults.json -junit out/6.1-debug-xfs-faults.xml"
	if j.Command != wantCmd {
		t.Errorf("command:\n got %s\nwant %s", j.Command, wantCmd)
	}
	wantBuild := "KBASE=6.1 KCONFIG_EXTRA=debug scripts/kernel.sh build stock && KBASE=6.1 KCONFIG_EXTRA=debug scripts/kernel.sh build patched"
	if j.Build != wantBuild {
		t.Errorf("build:\n got %s\nwant %s", j.Build, wantBuild)
	}
	if j.JSON != "out/6.1-debug-xfs-faults.json" || j.JUnit != "out/6.1-debug-xfs-faults.xml" || j.TimeoutMinutes <= 300 {
		t.Errorf("job %+v", j)
	}

	once, err := List(top, "out", Filter{Bases: []string{"6.1"}, Configs: []string{"default"}, Suites: []string{"once"}})
	if err != nil {
		t.Fatal(err)
	}
	distro, err := List(top, "out", Filter{Bases: []string{"6.12"}, Configs: []string{"distro"}, Suites: []string{"once"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(distro) != 1 || !strings.Contains(distro[0].Command, " -stock distro ") {
		t.Errorf("a distro job boots Debian's kernel as the stock one: %+v", distro)
	}

	if len(once) != 1 || strings.Contains(once[0].Command, "OVLKIT_FS") || strings.Contains(once[0].Command, "KCONFIG_EXTRA") {
		t.Errorf("a suite without ForEachFS runs once, on the default configuration: %+v", once)
	}

	builds := KernelBuilds(all)
	var ids []string
	for _, b := range builds {
		ids = append(ids, b.ID)
	}
	if want := []string{"6.1-default", "6.1-debug", "6.1-distro", "6.12-default", "6.12-debug", "6.12-distro"}; !reflect.DeepEqual(ids, want) {
		t.Errorf("kernel builds %v, want %v", ids, want)
	}
}

func TestListJobsRejectsBadFilters(t *testing.T) {
	top := fakeTree(t)
	for _, f := range []Filter{
		{Bases: []string{"5.10"}},
		{Configs: []string{"kasan"}},
		{FS: []string{"ext3"}},
		{Suites: []string{"nosuch"}},
		// Valid values that select nothing: faults runs only in debug.
		{Configs: []string{"default"}, Suites: []string{"faults"}},
		{FS: []string{"all"}, Suites: []string{"perfs"}},
	} {
		if jobs, err := List(top, "out", f); err == nil {
			t.Errorf("filter %+v: got %v, want an error", f, jobIDs(jobs))
		}
	}
	if _, err := List(t.TempDir(), "out", Filter{}); err == nil {
		t.Error("a tree without patches/*/series: want an error")
	}
}

// The suites ovlvm jobs finds by reading directories are the packages
// ovlvm test builds by default (go list), plus the nested modules.
func TestFindSuitesAgreesWithGoList(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	top, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	pkgs, err := initramfs.ListGuestPackages(context.Background(), goBin, top, "./tests/guest/...", "./cmd/ovlgraph")
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, p := range pkgs {
		rel, err := filepath.Rel(top, p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, "./"+filepath.ToSlash(rel))
	}
	suites, err := FindSuites(top)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	modules := 0
	for _, s := range suites {
		if s.Module {
			modules++
			continue
		}
		found = append(found, s.Package)
	}
	sort.Strings(listed)
	sort.Strings(found)
	if !reflect.DeepEqual(found, listed) {
		t.Errorf("FindSuites %v\n   go list %v", found, listed)
	}
	if modules == 0 {
		t.Error("no nested module found (tests/guest/faults is one)")
	}
}

func TestVersionLess(t *testing.T) {
	bases := []string{"6.12", "5.10", "6.1", "6.9", "6.1.1"}
	sort.Slice(bases, func(i, j int) bool { return versionLess(bases[i], bases[j]) })
	if want := []string{"5.10", "6.1", "6.1.1", "6.9", "6.12"}; !reflect.DeepEqual(bases, want) {
		t.Errorf("got %v, want %v", bases, want)
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"./tests/guest/x": "./tests/guest/x",
		"OVLKIT_FS=ext4":  "OVLKIT_FS=ext4",
		"":                "''",
		"a b":             "'a b'",
		"it's":            `'it'\''s'`,
		"$(id)":           "'$(id)'",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

const testPkg = "github.com/ovlkit/ovlkit/tests/guest/semantics"

// pairResults is a judged pair of runs with every status a test can end in
// and a run-level problem on each kernel.
func pairResults() (patched, stock *verdict.Result) {
	leaf := func(name string, kind verdict.Kind, status verdict.Status, out string) *verdict.Test {
		action := map[verdict.Status]string{verdict.Pass: "pass", verdict.Fail: "fail", verdict.Skip: "skip", verdict.ExpectedFail: "fail", verdict.UnexpectedPass: "pass"}[status]
		return &verdict.Test{Package: testPkg, Name: name, Kind: kind, Status: status, Action: action, Output: out, Elapsed: 0.5, Leaf: true}
	}
	proofOut := "=== RUN   TestProof/ext4\n    ovlkit-proves: ovl: add strict_upper option\n"
	ev := func(test, action string) verdict.Event {
		return verdict.Event{Action: action, Package: testPkg, Test: test}
	}
	patched = &verdict.Result{Label: "patched",
		Tests: []*verdict.Test{
			leaf("TestProof/ext4", verdict.Proof, verdict.Pass, ""),
			leaf("TestKeeps/xfs", verdict.Kept, verdict.Pass, ""),
			leaf("TestPlain", verdict.Plain, verdict.Pass, ""),
			leaf("TestSkipped/tmpfs", verdict.Plain, verdict.Skip, ""),
			leaf("TestBroken/btrfs", verdict.Kept, verdict.Fail, "    boom\n"),
		},
		Events:   []verdict.Event{ev("TestProof/ext4", "pass"), ev("TestBroken/btrfs", "fail")},
		Problems: []string{"kernel WARNING report while TestPlain was running:\n[ 1.0] WARNING: at fs/overlayfs/super.c"},
	}
	proofs := []string{"ovl: add strict_upper option"}
	stock = &verdict.Result{Label: "stock",
		Tests: []*verdict.Test{
			leaf("TestProof/ext4", verdict.Proof, verdict.ExpectedFail, proofOut+"    want EINVAL\n"),
			leaf("TestProof/xfs", verdict.Proof, verdict.UnexpectedPass, proofOut),
			leaf("TestKeeps/xfs", verdict.Kept, verdict.Pass, ""),
			leaf("TestPlain", verdict.Plain, verdict.Pass, ""),
		},
		Events:   []verdict.Event{ev("TestProof/ext4", "fail")},
		Problems: []string{"semantics: proof or keeps tests that ran on stock did not run on patched"},
	}
	stock.Tests[0].Proves, stock.Tests[1].Proves = proofs, proofs
	return patched, stock
}

// writeJob writes what "ovlvm test -junit -json" writes for results.
func writeJob(t *testing.T, dir, id string, results ...*verdict.Result) {
	t.Helper()
	if err := report.WriteJUnit(filepath.Join(dir, id+".xml"), results...); err != nil {
		t.Fatal(err)
	}
	if err := report.WriteJSON(filepath.Join(dir, id+".json"), results...); err != nil {
		t.Fatal(err)
	}
}

// A job's results read back from its files are what it judged: the same
// report.JUnit report, statuses and table under the job's labels.
func TestJobResultsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	patched, stock := pairResults()
	writeJob(t, dir, "6.1-default-ext4-semantics", patched, stock)
	got, err := Results(dir, Job{ID: "6.1-default-ext4-semantics"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Label != "6.1-default-ext4-semantics/patched" || got[1].Label != "6.1-default-ext4-semantics/stock" {
		t.Fatalf("labels: %+v", got)
	}
	patched.Label, stock.Label = got[0].Label, got[1].Label
	wantXML, err := report.JUnit(patched, stock)
	if err != nil {
		t.Fatal(err)
	}
	gotXML, err := report.JUnit(got...)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gotXML, wantXML) {
		t.Errorf("report.JUnit after the round trip:\n%s\nwant\n%s", gotXML, wantXML)
	}
	var gotTable, wantTable bytes.Buffer
	report.WriteTable(&gotTable, got...)
	report.WriteTable(&wantTable, patched, stock)
	if gotTable.String() != wantTable.String() {
		t.Errorf("table after the round trip:\n%s\nwant\n%s", gotTable.String(), wantTable.String())
	}
	for i, want := range [][]verdict.Status{{verdict.Pass, verdict.Pass, verdict.Pass, verdict.Skip, verdict.Fail}, {verdict.ExpectedFail, verdict.UnexpectedPass, verdict.Pass, verdict.Pass}} {
		var statuses []verdict.Status
		for _, tt := range got[i].Tests {
			statuses = append(statuses, tt.Status)
		}
		if !reflect.DeepEqual(statuses, want) {
			t.Errorf("%s statuses %v, want %v", got[i].Label, statuses, want)
		}
	}
	if p := got[1].Tests[1].Proves; !reflect.DeepEqual(p, []string{"ovl: add strict_upper option"}) {
		t.Errorf("unexpected pass proves %q", p)
	}
	if len(got[0].Events) != 2 || got[0].Events[0].Package != testPkg || len(got[1].Events) != 1 {
		t.Errorf("events: patched %+v stock %+v", got[0].Events, got[1].Events)
	}
	if got[0].OK() || got[1].OK() {
		t.Error("failed runs read back as passed")
	}
}

func TestMergeJobs(t *testing.T) {
	dir := t.TempDir()
	pass := func(label string) *verdict.Result {
		return &verdict.Result{Label: label, Tests: []*verdict.Test{{Package: testPkg, Name: "TestPlain", Status: verdict.Pass, Action: "pass", Leaf: true}}}
	}
	writeJob(t, dir, "good", pass("patched"), pass("stock"))
	patched, stock := pairResults()
	writeJob(t, dir, "bad", patched, stock)
	// A single-kernel run (ovlvm run) is not a job's result: it judged
	// no pair.
	writeJob(t, dir, "single", pass("patched"))
	if err := os.WriteFile(filepath.Join(dir, "truncated.xml"), []byte("<testsuites><testsuite"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nojson.xml"), []byte("<testsuites></testsuites>"), 0o644); err != nil {
		t.Fatal(err)
	}

	m := Merge(dir, []Job{{ID: "good"}})
	if !m.OK() || len(m.Results) != 2 {
		t.Errorf("one passing job: %+v", m)
	}
	m = Merge(dir, []Job{{ID: "good"}, {ID: "bad"}, {ID: "absent"}, {ID: "single"}, {ID: "truncated"}, {ID: "nojson"}})
	if m.OK() {
		t.Fatal("merge with failed and missing jobs passed")
	}
	if want := []string{"bad/patched", "bad/stock"}; !reflect.DeepEqual(m.Failed, want) {
		t.Errorf("failed %v, want %v", m.Failed, want)
	}
	if len(m.Missing) != 4 {
		t.Fatalf("missing %q, want absent, single, truncated and nojson", m.Missing)
	}
	for i, id := range []string{"absent", "single", "truncated", "nojson"} {
		if !strings.HasPrefix(m.Missing[i], "job "+id+":") {
			t.Errorf("missing[%d] = %q, want job %s", i, m.Missing[i], id)
		}
	}
	if !strings.Contains(m.Missing[1], "no stock run") {
		t.Errorf("single-kernel job: %q", m.Missing[1])
	}
	if len(m.Results) != 4 {
		t.Errorf("%d results, want the two runs of good and of bad", len(m.Results))
	}
}

func TestReadJobs(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"empty.json":  "[]",
		"dup.json":    `[{"id":"a"},{"id":"a"}]`,
		"path.json":   `[{"id":"../a"}]`,
		"noid.json":   `[{"base":"6.1"}]`,
		"broken.json": `[{"id":`,
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if jobs, err := Read(p); err == nil {
			t.Errorf("%s: got %+v, want an error", name, jobs)
		}
	}
	p := filepath.Join(dir, "ok.json")
	if err := os.WriteFile(p, []byte(`[{"id":"6.1-default-ext4-semantics","suite":"semantics"}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	jobs, err := Read(p)
	if err != nil || len(jobs) != 1 || jobs[0].Suite != "semantics" {
		t.Errorf("ok.json: %+v, %v", jobs, err)
	}
}
