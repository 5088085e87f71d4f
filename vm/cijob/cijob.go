package cijob

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/ovlkit/ovlkit/vm/guestproto"
	"github.com/ovlkit/ovlkit/vm/report"
	"github.com/ovlkit/ovlkit/vm/verdict"
)

// A Job is one cell of the CI matrix: the guest suite Suite, restricted to
// the upper filesystem FS, on one kernel base and configuration, run with
// "ovlvm test", which boots that base's stock and patched kernels side by
// side. A job holds both kernels because the verdict of a proof or keeps
// test is a statement about the pair: the proof must fail on stock and pass
// on patched, and CompareRuns must see every such test run on both. Split
// into a stock and a patched job, each half would be judged alone and a
// proof skipped on one kernel would pass unnoticed.
type Job struct {
	ID     string `json:"id"`
	Base   string `json:"base"`
	Config string `json:"config"`
	// FS is the filesystem the suite's ForEachFS tests run on, or "all"
	// for a suite that has none (splitting it would run it four times).
	FS    string `json:"fs"`
	Suite string `json:"suite"`
	// Package is the ovlvm -pkg pattern of the suite.
	Package string `json:"package"`
	// Env is the environment of Command and Build: KBASE, and
	// KCONFIG_EXTRA, from which scripts/kernel.sh names the build
	// directory ovlvm finds the kernels in.
	Env map[string]string `json:"env"`
	// Args are the arguments of ovlvm that run the job.
	Args []string `json:"args"`
	// Command runs the job from the top of the source tree, in a POSIX
	// shell; Build builds the two kernels it boots.
	Command string `json:"command"`
	Build   string `json:"build"`
	// JSON and JUnit are the files Command writes, named by ID.
	JSON  string `json:"json"`
	JUnit string `json:"junit"`
	// TimeoutMinutes bounds the whole job on a CI runner.
	TimeoutMinutes int `json:"timeout_minutes"`
}

// KernelBuild is a kernel base and configuration some jobs boot: CI builds
// each once and hands the bzImages to its jobs through a cache.
type KernelBuild struct {
	ID      string            `json:"id"`
	Base    string            `json:"base"`
	Config  string            `json:"config"`
	Env     map[string]string `json:"env"`
	Command string            `json:"command"`
}

// Config is a kernel configuration of the matrix.
type Config struct {
	Name string
	// KconfigExtra is KCONFIG_EXTRA: the fragments of kconfig/ merged
	// after guest, overlay and the base's own.
	KconfigExtra string
	// Args are ovlvm test flags the configuration needs.
	Args []string
	// Modules are suites that are Go modules of their own, which
	// ./tests/guest/... does not reach: only a configuration that names
	// them runs them.
	Modules        []string
	TimeoutMinutes int
}

// Configs are the kernel configurations of the matrix: the default one
// of make test, the debug one of make test-debug with that target's
// guest memory, timeouts, lockdep requirement and fault-injection suite,
// and the distribution's kernel as the stock one (make distro-test).
func Configs() []Config {
	return []Config{
		{Name: "default", TimeoutMinutes: 60},
		{
			Name: "debug", KconfigExtra: "debug",
			Args: []string{"-env", "OVLKIT_LOCKDEP=required", "-mem", "2048",
				"-timeout", "300m", "-test-timeout", "300m"},
			Modules: []string{"faults"},
			// The VM timeout plus building the guest tests and the
			// initramfs; hosted CI runners stop a job at 360.
			TimeoutMinutes: 330,
		},
		{
			// Debian's own linux-image of the base in the stock
			// kernel's place, judged with stock semantics beside the
			// patched build (make distro-test, Documentation/distro.rst).
			Name: "distro", Args: []string{"-stock", "distro"},
			TimeoutMinutes: 90,
		},
	}
}

// Filesystems are the values of a job's FS for a suite that runs its
// tests per filesystem: tmpfs and the disks the guest always has.
func Filesystems() []string {
	return append([]string{"tmpfs"}, guestproto.DiskFilesystems...)
}

// AllFS is the FS of a job whose suite does not run per filesystem.
const AllFS = "all"

// Filter selects jobs; an empty list selects every value of its axis.
type Filter struct {
	Bases, Configs, FS, Suites []string
}

// Suite is a guest test package the matrix runs.
type Suite struct {
	Name    string // as in the results table: semantics, ovlgraph, ...
	Package string // ./tests/guest/semantics
	// PerFS is set when the package calls guesttest.ForEachFS, the only
	// thing OVLKIT_FS restricts.
	PerFS bool
	// Module is set for a package inside a Go module of its own.
	Module bool
}

// FindSuites lists the guest test packages under top: every directory the
// patterns reach that has test files, and the nested modules below
// tests/guest, which are marked.
func FindSuites(top string) ([]Suite, error) {
	var suites []Suite
	// The guest packages of make test (ovlvm's default -pkg).
	for _, p := range []string{"./tests/guest/...", "./cmd/ovlgraph"} {
		root := filepath.Join(top, strings.TrimSuffix(p, "/..."))
		recursive := strings.HasSuffix(p, "/...")
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() {
				return nil
			}
			if path != root && !recursive {
				return filepath.SkipDir
			}
			// What the go command ignores in a ./... pattern.
			if n := d.Name(); path != root && (n == "testdata" || strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_")) {
				return filepath.SkipDir
			}
			s, ok, err := readSuite(top, path)
			if err != nil {
				return err
			}
			if ok {
				suites = append(suites, s)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("find guest suites in %s: %w", p, err)
		}
	}
	sort.Slice(suites, func(i, j int) bool { return suites[i].Name < suites[j].Name })
	for i := 1; i < len(suites); i++ {
		if suites[i].Name == suites[i-1].Name {
			return nil, fmt.Errorf("guest packages %s and %s have the same suite name %q",
				suites[i-1].Package, suites[i].Package, suites[i].Name)
		}
	}
	return suites, nil
}

// readSuite reads the package in dir: ok is false when it has no test files.
func readSuite(top, dir string) (Suite, bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return Suite{}, false, err
	}
	var s Suite
	tests := false
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") {
			continue
		}
		if strings.HasSuffix(e.Name(), "_test.go") {
			tests = true
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return Suite{}, false, err
		}
		if strings.Contains(string(b), "ForEachFS(") {
			s.PerFS = true
		}
	}
	if !tests {
		return Suite{}, false, nil
	}
	rel, err := filepath.Rel(top, dir)
	if err != nil {
		return Suite{}, false, err
	}
	s.Package = "./" + filepath.ToSlash(rel)
	s.Name = verdict.SuiteName(s.Package)
	for d := dir; d != top && d != filepath.Dir(d); d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			s.Module = true
			break
		}
	}
	return s, true, nil
}

// List returns the jobs of the matrix under top that f selects, each
// writing its results to outDir (relative to top), ordered by base,
// configuration, suite and filesystem.
func List(top, outDir string, f Filter) ([]Job, error) {
	bases, err := KernelBases(top)
	if err != nil {
		return nil, err
	}
	suites, err := FindSuites(top)
	if err != nil {
		return nil, err
	}
	var configNames, suiteNames []string
	for _, c := range Configs() {
		configNames = append(configNames, c.Name)
	}
	for _, s := range suites {
		suiteNames = append(suiteNames, s.Name)
	}
	fsNames := append(Filesystems(), AllFS)
	for _, axis := range []struct {
		name        string
		want, valid []string
	}{
		{"base", f.Bases, bases},
		{"config", f.Configs, configNames},
		{"fs", f.FS, fsNames},
		{"suite", f.Suites, suiteNames},
	} {
		for _, w := range axis.want {
			if !contains(axis.valid, w) {
				return nil, fmt.Errorf("no %s %q: want one of %s", axis.name, w, strings.Join(axis.valid, ", "))
			}
		}
	}
	selected := func(want []string, v string) bool { return len(want) == 0 || contains(want, v) }
	var jobs []Job
	for _, base := range bases {
		if !selected(f.Bases, base) {
			continue
		}
		for _, c := range Configs() {
			if !selected(f.Configs, c.Name) {
				continue
			}
			for _, s := range suites {
				if !selected(f.Suites, s.Name) || (s.Module && !contains(c.Modules, s.Name)) {
					continue
				}
				fss := []string{AllFS}
				if s.PerFS {
					fss = Filesystems()
				}
				for _, fsName := range fss {
					if selected(f.FS, fsName) {
						jobs = append(jobs, newJob(base, c, s, fsName, outDir))
					}
				}
			}
		}
	}
	if len(jobs) == 0 {
		return nil, errors.New("no job matches the filter")
	}
	return jobs, nil
}

func newJob(base string, c Config, s Suite, fsName, outDir string) Job {
	id := strings.Join([]string{base, c.Name, fsName, strings.ReplaceAll(s.Name, "/", "-")}, "-")
	j := Job{
		ID: id, Base: base, Config: c.Name, FS: fsName, Suite: s.Name, Package: s.Package,
		Env:            kernelEnv(base, c),
		JSON:           filepath.ToSlash(filepath.Join(outDir, id+".json")),
		JUnit:          filepath.ToSlash(filepath.Join(outDir, id+".xml")),
		TimeoutMinutes: c.TimeoutMinutes,
	}
	j.Args = []string{"test", "-kbase", base, "-pkg", s.Package}
	if fsName != AllFS {
		// Every disk stays attached: tests outside ForEachFS (NeedFS,
		// the store's refusal disks) need theirs whatever the job's FS.
		j.Args = append(j.Args, "-env", "OVLKIT_FS="+fsName)
	}
	j.Args = append(j.Args, c.Args...)
	j.Args = append(j.Args, "-json", j.JSON, "-junit", j.JUnit)
	j.Command = "mkdir -p " + shellQuote(filepath.ToSlash(outDir)) + " && " +
		envPrefix(j.Env) + "go run ./cmd/ovlvm " + shellJoin(j.Args)
	j.Build = kernelBuild(base, c).Command
	return j
}

func kernelEnv(base string, c Config) map[string]string {
	env := map[string]string{"KBASE": base}
	if c.KconfigExtra != "" {
		env["KCONFIG_EXTRA"] = c.KconfigExtra
	}
	return env
}

func kernelBuild(base string, c Config) KernelBuild {
	env := kernelEnv(base, c)
	var cmds []string
	for _, tree := range []string{"stock", "patched"} {
		cmds = append(cmds, envPrefix(env)+"scripts/kernel.sh build "+tree)
	}
	return KernelBuild{ID: base + "-" + c.Name, Base: base, Config: c.Name, Env: env,
		Command: strings.Join(cmds, " && ")}
}

// KernelBuilds returns the kernel builds jobs need, one per base and
// configuration, in the jobs' order.
func KernelBuilds(jobs []Job) []KernelBuild {
	var out []KernelBuild
	seen := map[string]bool{}
	for _, j := range jobs {
		k := j.Base + "\x00" + j.Config
		if seen[k] {
			continue
		}
		seen[k] = true
		for _, c := range Configs() {
			if c.Name == j.Config {
				out = append(out, kernelBuild(j.Base, c))
			}
		}
	}
	return out
}

// KernelBases lists the bases that have a series, patches/BASE/series,
// in version order.
func KernelBases(top string) ([]string, error) {
	series, err := filepath.Glob(filepath.Join(top, "patches", "*", "series"))
	if err != nil {
		return nil, err
	}
	var bases []string
	for _, s := range series {
		bases = append(bases, filepath.Base(filepath.Dir(s)))
	}
	if len(bases) == 0 {
		return nil, fmt.Errorf("no kernel base: no patches/*/series under %s", top)
	}
	sort.Slice(bases, func(i, j int) bool { return versionLess(bases[i], bases[j]) })
	return bases, nil
}

// versionLess orders "6.1" before "6.12" and "6.9" before "6.12".
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		x, errx := strconv.Atoi(as[i])
		y, erry := strconv.Atoi(bs[i])
		if errx != nil || erry != nil {
			if as[i] != bs[i] {
				return as[i] < bs[i]
			}
			continue
		}
		if x != y {
			return x < y
		}
	}
	return len(as) < len(bs)
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

func envPrefix(env map[string]string) string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k + "=" + shellQuote(env[k]) + " ")
	}
	return b.String()
}

func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

// shellQuote quotes s for a POSIX shell unless it is made only of
// characters no shell treats specially.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=./,:@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Results reads what job wrote to dir (its JUnit report and its go test
// -json events, named by its ID) and returns one judged run per kernel,
// labelled ID/KERNEL. The JUnit report carries the verdict: every test's
// judged status and the run-level problems (kernel reports, timeouts,
// proofs not compared), which the events do not hold. An error means the
// job left no complete result: it did not run, or died before judging.
func Results(dir string, job Job) ([]*verdict.Result, error) {
	xmlPath := filepath.Join(dir, job.ID+".xml")
	b, err := os.ReadFile(xmlPath)
	if err != nil {
		return nil, fmt.Errorf("job %s: no JUnit report: %w", job.ID, err)
	}
	runs, err := report.ReadJUnit(b)
	if err != nil {
		return nil, fmt.Errorf("job %s: JUnit report %s: %w", job.ID, xmlPath, err)
	}
	jsonPath := filepath.Join(dir, job.ID+".json")
	f, err := os.Open(jsonPath)
	if err != nil {
		return nil, fmt.Errorf("job %s: no go test -json events: %w", job.ID, err)
	}
	defer f.Close()
	evs, err := verdict.ReadEvents(f)
	if err != nil {
		return nil, fmt.Errorf("job %s: %s: %w", job.ID, jsonPath, err)
	}
	// The runs of every job, as ovlvm test labels them.
	kernels := []string{"patched", "stock"}
	byLabel := map[string]*verdict.Result{}
	for _, k := range kernels {
		byLabel[k] = &verdict.Result{Label: job.ID + "/" + k}
	}
	for label, run := range runs {
		r := byLabel[label]
		if r == nil {
			return nil, fmt.Errorf("job %s: JUnit report has a run %q, not a stock or patched one", job.ID, label)
		}
		r.Tests, r.Problems = run.Tests, run.Problems
	}
	for _, e := range evs {
		label, pkg, ok := strings.Cut(e.Package, ":")
		r := byLabel[label]
		if !ok || r == nil {
			return nil, fmt.Errorf("job %s: event of package %q is not of a stock or patched run", job.ID, e.Package)
		}
		e.Package = pkg
		r.Events = append(r.Events, e)
	}
	var out []*verdict.Result
	for _, k := range kernels {
		r := byLabel[k]
		if len(r.Tests) == 0 && len(r.Problems) == 0 {
			// ovlvm test reports a run without tests as a problem, so
			// this report is not of a two-kernel run.
			return nil, fmt.Errorf("job %s: JUnit report has no %s run", job.ID, k)
		}
		out = append(out, r)
	}
	return out, nil
}

// Merged is the outcome of Merge.
type Merged struct {
	Results []*verdict.Result // two per job with results, in the jobs' order
	Missing []string          // jobs without a complete result, each a sentence
	Failed  []string          // labels of runs that failed
}

// OK reports whether every job left a result and every run passed.
func (m *Merged) OK() bool { return len(m.Missing) == 0 && len(m.Failed) == 0 }

// Merge reads the results of jobs from dir.
func Merge(dir string, jobs []Job) *Merged {
	m := &Merged{}
	for _, j := range jobs {
		rs, err := Results(dir, j)
		if err != nil {
			m.Missing = append(m.Missing, err.Error())
			continue
		}
		for _, r := range rs {
			if !r.OK() {
				m.Failed = append(m.Failed, r.Label)
			}
		}
		m.Results = append(m.Results, rs...)
	}
	return m
}

// Read reads a job list as "ovlvm jobs -json" prints it.
func Read(path string) ([]Job, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("job list: %w", err)
	}
	var jobs []Job
	if err := json.Unmarshal(b, &jobs); err != nil {
		return nil, fmt.Errorf("job list %s: %w", path, err)
	}
	seen := map[string]bool{}
	for _, j := range jobs {
		if j.ID == "" || strings.ContainsAny(j.ID, `/\`) || j.ID == "." || j.ID == ".." {
			return nil, fmt.Errorf("job list %s: bad job id %q", path, j.ID)
		}
		if seen[j.ID] {
			return nil, fmt.Errorf("job list %s: job %s listed twice", path, j.ID)
		}
		seen[j.ID] = true
	}
	if len(jobs) == 0 {
		return nil, fmt.Errorf("job list %s: no jobs", path)
	}
	return jobs, nil
}
