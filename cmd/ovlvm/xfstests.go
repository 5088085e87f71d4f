package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ovlkit/ovlkit/vm"
)

// cmdXfstests runs xfstests' overlay tests (./check -overlay) in the
// Debian guest on the stock and the patched kernel with the same
// configuration and lists every test that passes on stock and fails on
// patched.
func cmdXfstests(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("xfstests", flag.ExitOnError)
	top := fs.String("C", ".", "ovlkit source tree")
	cache := fs.String("cache", defaultCache(), "cache directory (image, accelerator probe, run dirs)")
	kbase := fs.String("kbase", envOr("KBASE", defaultKBase), "kernel base: which linux-source trees stock and patched name")
	kernels := fs.String("kernel", "stock,patched", "kernels to run, comma-separated; the first is the baseline")
	fsList := fs.String("fs", "ext4", "base filesystems of the test and scratch disks, comma-separated: ext4, xfs")
	group := fs.String("g", "quick", "xfstests group(s) for ./check -g (overlay tests and the generic ones that run on overlay)")
	tests := fs.String("tests", "", "comma-separated tests to run instead of a group (overlay/001,generic/001)")
	exclude := fs.String("x", "", "comma-separated tests to leave out (./check -e)")
	part := fs.String("part", "", "N/OF: with -g, run only the N-th of OF near-equal, contiguous parts of the group's tests "+
		"(as the image's group lists give them), so that a group too long for one sitting runs in parts")
	image := fs.String("image", "", "root image (default: scripts/xfstests-image.sh builds or finds it)")
	accel := fs.String("accel", envOr("ACCEL", "auto"), "auto, kvm or tcg")
	mem := fs.Int("mem", 2048, "guest memory in MiB")
	timeout := fs.Duration("timeout", 6*time.Hour, "timeout for each VM")
	junit := fs.String("junit", "", "write a JUnit XML report here")
	table := fs.String("table", "", "write the per-test table (reStructuredText) here")
	verbose := fs.Bool("v", false, "show the guest consoles")
	from := fs.String("from", "", "judge earlier runs' results in these directories (run-xfstests-* directories of the cache, "+
		"comma-separated: the sittings of one selection, in the order they ran) instead of booting")
	baseline := fs.String("baseline", "all", "what the baseline (first) kernel runs: all the tests, or failures: "+
		"only those that did not pass on every other kernel, which run first, on every filesystem at once")
	fs.Parse(args)
	if *baseline != "all" && *baseline != "failures" {
		return fmt.Errorf("-baseline %q: all or failures", *baseline)
	}
	subset := *baseline == "failures"

	if *from != "" {
		return judgeXfstestsRun(*from, *kernels, *fsList, subset, *table, *junit)
	}

	var testPart *vm.TestPart
	if *part != "" {
		p, err := vm.ParseTestPart(*part)
		if err != nil {
			return err
		}
		if *tests != "" {
			return errors.New("-part splits a group (-g), not a -tests list")
		}
		testPart = &p
	}
	check := []string{}
	switch {
	case *tests != "":
		check = append(check, strings.Split(*tests, ",")...)
	case *group != "":
		check = append(check, "-g", *group)
	default:
		return errors.New("-g or -tests is needed")
	}
	g, err := setupDebianGuest(ctx, *top, *cache, *kbase, *kernels, *image, *accel)
	if err != nil {
		return err
	}
	*image = g.image
	if testPart != nil {
		if check, err = groupPart(ctx, g.image, *group, *testPart); err != nil {
			return err
		}
	}
	if *exclude != "" {
		check = append(check, "-e", *exclude)
	}
	pruneRuns(*cache)
	runRoot, err := os.MkdirTemp(*cache, "run-xfstests-")
	if err != nil {
		return err
	}

	config := func(k guestKernel, f string, check []string) vm.XfstestsConfig {
		return vm.XfstestsConfig{Image: *image, FS: f, Check: check, MemoryMB: *mem, Timeout: *timeout,
			WorkDir: xfsRunDir(runRoot, k.name, f)}
	}
	filesystems := splitList(*fsList)
	if subset && len(g.kernels) > 1 {
		return runXfstestsBaselineOnFailures(ctx, g, *verbose, filesystems, check, config, *table, *junit)
	}
	var all []*vm.XfstestsResult
	var failures []string
	for _, f := range filesystems {
		res, err := g.run(ctx, *verbose, func(k guestKernel) vm.XfstestsConfig {
			return config(k, f, check)
		})
		if err != nil {
			return err
		}
		all = append(all, res...)
		failures = append(failures, reportXfstests(os.Stdout, f, res)...)
	}
	return writeXfsReports(all, failures, *table, *junit)
}

// runXfstestsBaselineOnFailures runs the kernels after the first on every
// filesystem at once, then the first (the baseline) on each filesystem
// with only the tests that did not pass on all of them. A regression is
// a test that passes on the baseline and fails on another kernel, so the
// tests every other kernel passes need no baseline run: where most tests
// pass, this takes about half the guest time of running both in full.
func runXfstestsBaselineOnFailures(ctx context.Context, g *debianGuest, verbose bool,
	filesystems, check []string, config func(k guestKernel, f string, check []string) vm.XfstestsConfig, table, junit string) error {
	base, others := g.kernels[0], g.kernels[1:]
	var jobs []vm.XfstestsConfig
	for _, f := range filesystems {
		for _, k := range others {
			jobs = append(jobs, g.job(k, verbose, config(k, f, check)))
		}
	}
	first, err := runGuests(ctx, jobs)
	if err != nil {
		return err
	}
	byFS := map[string][]*vm.XfstestsResult{}
	for _, r := range first {
		byFS[r.FS] = append(byFS[r.FS], r)
	}
	baselines := map[string]*vm.XfstestsResult{}
	jobs = nil
	for _, f := range filesystems {
		retry := vm.NotPassed(byFS[f]...)
		progress("%s on %s: %d tests did not pass on %s; the baseline runs them", base.name, f, len(retry), kernelNames(others))
		if len(retry) == 0 {
			baselines[f] = &vm.XfstestsResult{Label: base.name, FS: f, Commit: byFS[f][0].Commit, Subset: true}
			continue
		}
		jobs = append(jobs, g.job(base, verbose, config(base, f, retry)))
	}
	second, err := runGuests(ctx, jobs)
	if err != nil {
		return err
	}
	for _, r := range second {
		r.Subset = true
		baselines[r.FS] = r
	}
	var all []*vm.XfstestsResult
	var failures []string
	for _, f := range filesystems {
		res := append([]*vm.XfstestsResult{baselines[f]}, byFS[f]...)
		all = append(all, res...)
		failures = append(failures, reportXfstests(os.Stdout, f, res)...)
	}
	return writeXfsReports(all, failures, table, junit)
}

// groupPart expands group as check would, from the image's group lists,
// and returns part p of its tests.
func groupPart(ctx context.Context, image, group string, p vm.TestPart) ([]string, error) {
	all, err := vm.XfstestsGroup(ctx, image, group)
	if err != nil {
		return nil, err
	}
	sel := p.Select(all)
	if len(sel) == 0 {
		return nil, fmt.Errorf("-g %s has %d tests: part %d/%d is empty", group, len(all), p.N, p.Of)
	}
	progress("-g %s: %d tests; part %d/%d is %d of them, %s to %s", group, len(all), p.N, p.Of, len(sel), sel[0], sel[len(sel)-1])
	return sel, nil
}

// xfsRunDir is the work directory of one kernel's boot on one base
// filesystem within a run; -from reads it back from the same place.
func xfsRunDir(runRoot, kernel, fs string) string {
	return filepath.Join(runRoot, kernel+"-"+fs)
}

func kernelNames(ks []guestKernel) string {
	var names []string
	for _, k := range ks {
		names = append(names, k.name)
	}
	return strings.Join(names, ", ")
}

// judgeXfstestsRun reads back the runs earlier "ovlvm xfstests" left in
// dirs, one work directory per kernel and filesystem, and reports on them
// as one run would have: a run of hours whose report was lost (the
// caller was stopped, its terminal closed) need not boot again, and a
// selection that took several sittings is judged whole. A kernel's
// results on a filesystem are its sittings' merged (vm.MergeXfstests);
// a sitting need not have run every kernel and filesystem.
func judgeXfstestsRun(dirs, kernels, fsList string, subset bool, table, junit string) error {
	var all []*vm.XfstestsResult
	var failures []string
	for _, f := range splitList(fsList) {
		var res []*vm.XfstestsResult
		for i, k := range splitList(kernels) {
			r, err := loadXfsSittings(splitList(dirs), k, f)
			if err != nil {
				return err
			}
			r.Subset = subset && i == 0
			res = append(res, r)
		}
		all = append(all, res...)
		failures = append(failures, reportXfstests(os.Stdout, f, res)...)
	}
	return writeXfsReports(all, failures, table, junit)
}

// loadXfsSittings reads kernel's runs on fs from those of dirs that have
// one and merges them.
func loadXfsSittings(dirs []string, kernel, fs string) (*vm.XfstestsResult, error) {
	var sittings []*vm.XfstestsResult
	for _, d := range dirs {
		wd := xfsRunDir(d, kernel, fs)
		if len(dirs) > 1 {
			if _, err := os.Stat(filepath.Join(wd, "serial.log")); errors.Is(err, os.ErrNotExist) {
				continue
			}
		}
		r, err := vm.LoadXfstests(kernel, fs, wd)
		if err != nil {
			return nil, err
		}
		sittings = append(sittings, r)
	}
	if len(sittings) == 0 {
		return nil, fmt.Errorf("no run of %s on %s in %s", kernel, fs, strings.Join(dirs, ", "))
	}
	return vm.MergeXfstests(sittings...)
}

// writeXfsReports writes the table and the JUnit report asked for and
// turns what fails the run into its error.
func writeXfsReports(all []*vm.XfstestsResult, failures []string, table, junit string) error {
	if table != "" {
		if err := writeXfsTables(table, all); err != nil {
			return err
		}
		progress("table: %s", table)
	}
	if junit != "" {
		if err := vm.WriteXfstestsJUnit(junit, all...); err != nil {
			return err
		}
		progress("JUnit report: %s", junit)
	}
	if len(failures) > 0 {
		return fmt.Errorf("xfstests: %s", strings.Join(failures, "; "))
	}
	return nil
}

// reportXfstests prints counts per kernel, every difference from the
// first (baseline) kernel, and the output of each regression. It returns
// what fails the run: regressions and runs that did not complete.
func reportXfstests(w io.Writer, fs string, res []*vm.XfstestsResult) []string {
	var failures []string
	fmt.Fprintf(w, "\nxfstests ./check -overlay on %s\n", fs)
	for _, r := range res {
		if r.Subset && r.Serial == "" {
			fmt.Fprintf(w, "  %-8s not booted: every test passed on every other kernel\n", r.Label)
			continue
		}
		p, f, n := r.Counts()
		commit := r.Commit
		if commit == "" {
			commit = "unknown"
		}
		took := fmt.Sprintf("in %.0fs", r.Seconds)
		if r.Seconds == 0 {
			took = "(guest time not recorded)"
		}
		fmt.Fprintf(w, "  %-8s %s: %d passed, %d failed, %d not run %s (xfstests %s; serial log %s)\n",
			r.Label, r.Uname, p, f, n, took, commit, r.Serial)
		if r.Subset {
			fmt.Fprintf(w, "  %-8s ran only the tests that did not pass on every other kernel\n", r.Label)
		}
		for _, p := range r.Problems {
			fmt.Fprintf(w, "  PROBLEM [%s] %s\n", r.Label, strings.ReplaceAll(p, "\n", "\n    "))
			failures = append(failures, fmt.Sprintf("%s on %s: %s", r.Label, fs, firstLines(p, 1)))
		}
	}
	for _, r := range res[1:] {
		diffs := vm.CompareXfstests(res[0], r)
		var regress []vm.XfsDiff
		for _, d := range diffs {
			status := func(t *vm.XfsTest) string {
				if t == nil {
					return "missing"
				}
				return string(t.Status)
			}
			fmt.Fprintf(w, "  %-12s %s %s, %s %s\n", d.Name, res[0].Label, status(d.Base), r.Label, status(d.Other))
			if d.Regression {
				regress = append(regress, d)
			}
		}
		if len(diffs) == 0 {
			which := "every test"
			if res[0].Subset {
				which = "every test " + res[0].Label + " ran"
			}
			fmt.Fprintf(w, "  %s has the same outcome on %s and %s\n", which, res[0].Label, r.Label)
		}
		for _, d := range regress {
			fmt.Fprintf(w, "\nREGRESSION [%s, %s] %s passes on %s and fails on %s\n", r.Label, fs, d.Name, res[0].Label, r.Label)
			if d.Other != nil {
				fmt.Fprintf(w, "    %s\n    %s\n", d.Other.Message, strings.ReplaceAll(firstLines(d.Other.Output, 60), "\n", "\n    "))
			}
			failures = append(failures, fmt.Sprintf("%s regresses on %s (%s)", d.Name, r.Label, fs))
		}
	}
	for _, r := range res {
		for _, t := range r.Tests {
			if t.Status == vm.XfsFail {
				fmt.Fprintf(w, "  fails on %s (%s): %s %s\n", r.Label, fs, t.Name, t.Message)
			}
		}
	}
	return failures
}

func writeXfsTables(path string, all []*vm.XfstestsResult) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	byFS := map[string][]*vm.XfstestsResult{}
	var order []string
	for _, r := range all {
		if byFS[r.FS] == nil {
			order = append(order, r.FS)
		}
		byFS[r.FS] = append(byFS[r.FS], r)
	}
	for _, fs := range order {
		fmt.Fprintf(f, "Base filesystem %s, xfstests %s:\n\n", fs, byFS[fs][0].Commit)
		if r := byFS[fs][0]; r.Subset {
			fmt.Fprintf(f, "%s ran only the tests that did not pass on every other kernel (\"-\": passed on all of them).\n\n", r.Label)
		}
		vm.WriteXfstestsTable(f, byFS[fs]...)
		fmt.Fprintln(f)
	}
	return f.Close()
}

// debianGuest is what a run of the Debian guest (xfstests, readers) needs:
// the kernels in order (the first is the baseline), the root image, QEMU
// and the accelerator.
type debianGuest struct {
	kernels []guestKernel
	image   string
	qemu    string
	accel   vm.Accelerator
}

type guestKernel struct{ name, path string }

// setupDebianGuest resolves the kernels, builds or finds the image
// (scripts/xfstests-image.sh) unless one is given, and picks the
// accelerator.
func setupDebianGuest(ctx context.Context, top, cache, kbase, kernels, image, accel string, imageEnv ...string) (*debianGuest, error) {
	abs, err := filepath.Abs(top)
	if err != nil {
		return nil, err
	}
	g := &debianGuest{image: image}
	for _, k := range strings.Split(kernels, ",") {
		p, err := resolveKernel(abs, kbase, k)
		if err != nil {
			return nil, err
		}
		g.kernels = append(g.kernels, guestKernel{k, p})
	}
	if g.qemu, err = exec.LookPath("qemu-system-x86_64"); err != nil {
		return nil, errors.New("qemu-system-x86_64 not found (run scripts/deps.sh)")
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, err
	}
	if g.image == "" {
		t0 := time.Now()
		progress("image: scripts/xfstests-image.sh (cached by Debian suite and xfstests commit)")
		cmd := exec.CommandContext(ctx, filepath.Join(abs, "scripts", "xfstests-image.sh"))
		cmd.Env = append(append(os.Environ(), "CACHE="+cache), imageEnv...)
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("scripts/xfstests-image.sh: %w", err)
		}
		// The path is the last line; tools the script runs may print more.
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		g.image = strings.TrimSpace(lines[len(lines)-1])
		progress("image: %s (%.0fs)", g.image, time.Since(t0).Seconds())
	}
	if g.accel, err = chooseAccel(ctx, accel, g.qemu, g.kernels[0].path, cache); err != nil {
		return nil, err
	}
	return g, nil
}

// run boots every kernel at once (each guest has one vCPU) with the
// configuration config makes for it, and returns the results in the
// kernels' order.
func (g *debianGuest) run(ctx context.Context, verbose bool, config func(k guestKernel) vm.XfstestsConfig) ([]*vm.XfstestsResult, error) {
	jobs := make([]vm.XfstestsConfig, len(g.kernels))
	for i, k := range g.kernels {
		jobs[i] = g.job(k, verbose, config(k))
	}
	return runGuests(ctx, jobs)
}

// job completes c for a boot of kernel k.
func (g *debianGuest) job(k guestKernel, verbose bool, c vm.XfstestsConfig) vm.XfstestsConfig {
	c.Label, c.Kernel, c.QEMU, c.Accel, c.Progress = k.name, k.path, g.qemu, g.accel, os.Stderr
	if verbose {
		c.Console = prefixWriter(os.Stderr, k.name+"-"+c.FS)
	}
	return c
}

// runGuests boots every job at once and returns the results in order.
func runGuests(ctx context.Context, jobs []vm.XfstestsConfig) ([]*vm.XfstestsResult, error) {
	res := make([]*vm.XfstestsResult, len(jobs))
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, c := range jobs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			res[i], errs[i] = vm.RunXfstests(ctx, c)
		}(i)
	}
	wg.Wait()
	return res, errors.Join(errs...)
}
