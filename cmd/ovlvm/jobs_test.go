package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ovlkit/ovlkit/vm/cijob"
	"github.com/ovlkit/ovlkit/vm/report"
	"github.com/ovlkit/ovlkit/vm/verdict"
)

// Every job of the repository's matrix runs ovlvm test with flags ovlvm
// test has, and writes the files its ID names.
func TestJobsOfTheRepository(t *testing.T) {
	var out bytes.Buffer
	if err := cmdJobs(&out, []string{"-C", "../..", "-json"}); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "\n"); n != 1 {
		t.Errorf("-json printed %d lines, want one (a CI matrix is one output line)", n)
	}
	var jobs []cijob.Job
	if err := json.Unmarshal(out.Bytes(), &jobs); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	bases := map[string]bool{}
	for _, j := range jobs {
		if seen[j.ID] {
			t.Errorf("job %s listed twice", j.ID)
		}
		seen[j.ID] = true
		bases[j.Base] = true
		if len(j.Args) == 0 || j.Args[0] != "test" {
			t.Fatalf("job %s does not run ovlvm test: %q", j.ID, j.Args)
		}
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var o options
		o.register(fs)
		fs.String("patched", "patched", "")
		fs.String("stock", "stock", "")
		if err := fs.Parse(j.Args[1:]); err != nil {
			t.Errorf("job %s: ovlvm test rejects its flags: %v", j.ID, err)
			continue
		}
		if fs.NArg() != 0 || o.kbase != j.Base || o.jsonOut != "build/jobs/"+j.ID+".json" || o.junit != "build/jobs/"+j.ID+".xml" {
			t.Errorf("job %s: kbase %s json %s junit %s, extra %q", j.ID, o.kbase, o.jsonOut, o.junit, fs.Args())
		}
		if len(o.pkgs) != 1 || o.pkgs[0] != j.Package {
			t.Errorf("job %s: packages %q, want %s", j.ID, o.pkgs, j.Package)
		}
		if !strings.HasSuffix(j.Command, "go run ./cmd/ovlvm "+strings.Join(j.Args, " ")) {
			t.Errorf("job %s: command %q does not end in its arguments", j.ID, j.Command)
		}
	}
	if !bases["6.1"] || !bases["6.12"] {
		t.Errorf("bases %v, want 6.1 and 6.12", bases)
	}

	out.Reset()
	if err := cmdJobs(&out, []string{"-C", "../..", "-commands"}); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "\n"); n != len(jobs) {
		t.Errorf("-commands printed %d lines for %d jobs", n, len(jobs))
	}

	out.Reset()
	if err := cmdJobs(&out, []string{"-C", "../..", "-kernels", "-json"}); err != nil {
		t.Fatal(err)
	}
	var builds []cijob.KernelBuild
	if err := json.Unmarshal(out.Bytes(), &builds); err != nil {
		t.Fatal(err)
	}
	if len(builds) != len(cijob.Configs())*len(bases) {
		t.Errorf("%d kernel builds for %d bases, want one per configuration (%d) each",
			len(builds), len(bases), len(cijob.Configs()))
	}

	for _, bad := range [][]string{{"-base", "2.6"}, {"-json", "-commands"}, {"extra"}, {"-nosuchflag"}} {
		out.Reset()
		if err := cmdJobs(&out, append([]string{"-C", "../.."}, bad...)); err == nil {
			t.Errorf("jobs %q: want an error", bad)
		}
	}
}

func TestMergeCommand(t *testing.T) {
	dir := t.TempDir()
	run := func(label string, status verdict.Status) *verdict.Result {
		action := map[verdict.Status]string{verdict.Pass: "pass", verdict.Fail: "fail"}[status]
		return &verdict.Result{Label: label, Tests: []*verdict.Test{{
			Package: "github.com/ovlkit/ovlkit/tests/guest/semantics", Name: "TestRename/ext4",
			Status: status, Action: action, Kind: verdict.Kept, Leaf: true,
		}}}
	}
	write := func(id string, results ...*verdict.Result) {
		if err := report.WriteJUnit(filepath.Join(dir, id+".xml"), results...); err != nil {
			t.Fatal(err)
		}
		if err := report.WriteJSON(filepath.Join(dir, id+".json"), results...); err != nil {
			t.Fatal(err)
		}
	}
	jobsFile := func(ids ...string) string {
		var jobs []cijob.Job
		for _, id := range ids {
			jobs = append(jobs, cijob.Job{ID: id})
		}
		b, err := json.Marshal(jobs)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), "jobs.json")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("a", run("patched", verdict.Pass), run("stock", verdict.Pass))
	write("b", run("patched", verdict.Pass), run("stock", verdict.Pass))
	write("c", run("patched", verdict.Fail), run("stock", verdict.Pass))
	junit := filepath.Join(t.TempDir(), "junit.xml")

	var out bytes.Buffer
	err := cmdMerge(&out, []string{"-jobs", jobsFile("a", "b"), "-dir", dir, "-junit", junit})
	if err != nil {
		t.Fatalf("two passing jobs: %v\n%s", err, out.String())
	}
	for _, want := range []string{"a/patched", "b/stock", "2 of 2 jobs reported"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	b, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Suites []struct {
			Name string `xml:"name,attr"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range doc.Suites {
		names = append(names, s.Name)
	}
	if strings.Join(names, " ") != "a/patched/semantics a/stock/semantics b/patched/semantics b/stock/semantics" {
		t.Errorf("merged JUnit suites %q", names)
	}

	out.Reset()
	if err := cmdMerge(&out, []string{"-jobs", jobsFile("a", "c"), "-dir", dir}); err == nil || !strings.Contains(err.Error(), "c/patched") {
		t.Errorf("a failed job: err %v\n%s", err, out.String())
	}
	out.Reset()
	if err := cmdMerge(&out, []string{"-jobs", jobsFile("a", "gone"), "-dir", dir}); err == nil || !strings.Contains(out.String(), "MISSING job gone") {
		t.Errorf("a missing job: err %v\n%s", err, out.String())
	}
}
