// Command ovlvm boots ovlkit kernels in QEMU and runs the guest test
// suites there.
//
//	ovlvm run      [flags]   one kernel, print the results table
//	ovlvm test     [flags]   patched and stock kernels side by side; proof
//	                         tests must fail on stock and pass on patched,
//	                         keeps tests pass on both, and each must run
//	                         on both
//	ovlvm selftest [flags]   show that the harness catches a failing guest
//	                         test and a kernel WARN
//	ovlvm junit -o FILE      turn go test -json on stdin into a table and
//	                         JUnit XML (for the host unit tests)
//	ovlvm cuts     [flags]   hard cuts: a store workload on persistent
//	                         disks, QEMU killed at a seeded moment, the
//	                         next boot checked against what was acknowledged
//
// Kernels are named like scripts/kernel.sh names trees (stock, patched, or a
// development tree) or given as a path to a bzImage. -kbase (default $KBASE,
// else 6.1) chooses the kernel base: the trees of linux-source-<kbase> and
// the series patches/<kbase> that proof declarations are judged against.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ovlkit/ovlkit/vm"
	"github.com/ovlkit/ovlkit/vm/guestproto"
	"github.com/ovlkit/ovlkit/vm/initramfs"
	"github.com/ovlkit/ovlkit/vm/report"
	"github.com/ovlkit/ovlkit/vm/verdict"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "run":
		err = cmdRun(ctx, os.Args[2:])
	case "test":
		err = cmdTest(ctx, os.Args[2:])
	case "selftest":
		err = cmdSelftest(ctx, os.Args[2:])
	case "junit":
		err = cmdJUnit(os.Args[2:])
	case "xfstests":
		err = cmdXfstests(ctx, os.Args[2:])
	case "readers":
		err = cmdReaders(ctx, os.Args[2:])
	case "cuts":
		err = cmdCuts(ctx, os.Args[2:])
	case "jobs", "merge":
		err = cmdJobsMerge(os.Args[1], os.Args[2:])
	case "-h", "-help", "--help", "help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "ovlvm: unknown command %q\n", os.Args[1])
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ovlvm:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: ovlvm run|test|selftest [flags]  (ovlvm CMD -h for flags)")
	os.Exit(2)
}

// options are the flags every command shares.
type options struct {
	top      string
	kbase    string
	cache    string
	pkgs     multiFlag
	run      string
	bench    string
	fs       string
	accel    string
	mem      int
	timeout  time.Duration
	testTime time.Duration
	junit    string
	jsonOut  string
	verbose  bool
	env      multiFlag
	files    fileFlag
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// fileFlag is the repeatable -file HOST=GUEST.
type fileFlag []initramfs.File

func (f *fileFlag) String() string {
	var s []string
	for _, x := range *f {
		s = append(s, x.Host+"="+x.Guest)
	}
	return strings.Join(s, ",")
}

func (f *fileFlag) Set(v string) error {
	x, err := initramfs.ParseFile(v)
	if err != nil {
		return err
	}
	for _, y := range *f {
		if y.Guest == x.Guest {
			return fmt.Errorf("%q: %s is given twice", v, x.Guest)
		}
	}
	if x.Host, err = filepath.Abs(x.Host); err != nil {
		return err
	}
	*f = append(*f, x)
	return nil
}

func (o *options) register(fs *flag.FlagSet) {
	fs.StringVar(&o.top, "C", ".", "ovlkit source tree")
	fs.StringVar(&o.kbase, "kbase", envOr("KBASE", defaultKBase),
		"kernel base: kernel trees of linux-source-KBASE, proofs judged against patches/KBASE")
	fs.StringVar(&o.cache, "cache", defaultCache(), "cache directory (initramfs, accelerator probe, run dirs)")
	fs.Var(&o.pkgs, "pkg", "guest test package pattern (repeatable; default ./tests/guest/... and ./cmd/ovlgraph)")
	fs.StringVar(&o.run, "run", "", "run only guest tests matching this regexp")
	fs.StringVar(&o.bench, "bench", "", "run guest benchmarks matching this regexp")
	fs.StringVar(&o.fs, "fs", strings.Join(append(append([]string{}, guestproto.DiskFilesystems...), guestproto.UnfitFilesystems...), ","),
		"disk filesystems to attach (tmpfs is always there; "+strings.Join(guestproto.UnfitFilesystems, " and ")+" are for refusal tests)")
	fs.StringVar(&o.accel, "accel", envOr("ACCEL", "auto"), "auto, kvm or tcg")
	fs.IntVar(&o.mem, "mem", 512, "guest memory in MiB")
	// Under TCG on a busy 2-core host the graph suite (128- and 500-layer
	// stacks on four filesystems) alone can take ten minutes.
	fs.DurationVar(&o.timeout, "timeout", 45*time.Minute, "timeout for each VM")
	fs.DurationVar(&o.testTime, "test-timeout", 25*time.Minute, "timeout for each guest test binary")
	fs.StringVar(&o.junit, "junit", "", "write a JUnit XML report here")
	fs.StringVar(&o.jsonOut, "json", "", "write go test -json events here")
	fs.BoolVar(&o.verbose, "v", false, "show the guest console")
	fs.Var(&o.env, "env", "KEY=VALUE for the guest tests (repeatable)")
	fs.Var(&o.files, "file", "HOST=GUEST: put the host file HOST into the guest at the absolute path GUEST, "+
		"with its permissions (repeatable)")
}

// defaultKBase is the kernel base when neither -kbase nor $KBASE name one,
// as in the Makefile and scripts/lib.sh.
const defaultKBase = "6.1"

func defaultCache() string {
	if c := os.Getenv("CACHE"); c != "" {
		return c
	}
	if c := os.Getenv("XDG_CACHE_HOME"); c != "" {
		return filepath.Join(c, "ovlkit")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "ovlkit")
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// harness holds what every run of one invocation shares.
type harness struct {
	o         options
	goBin     string
	qemu      string
	initramfs string
	pkgs      []initramfs.Package
	accel     vm.Accelerator
	runRoot   string
}

// kernelHarness resolves the kernel named name and sets up the harness
// that boots it.
func kernelHarness(ctx context.Context, o options, name string) (h *harness, kernel string, err error) {
	if kernel, err = resolveKernel(o.top, o.kbase, name); err != nil {
		return nil, "", err
	}
	if h, err = newHarness(ctx, o, kernel); err != nil {
		return nil, "", err
	}
	return h, kernel, nil
}

func newHarness(ctx context.Context, o options, probeKernel string) (*harness, error) {
	h := &harness{o: o}
	var err error
	if h.o.top, err = filepath.Abs(o.top); err != nil {
		return nil, err
	}
	if h.goBin, err = exec.LookPath("go"); err != nil {
		return nil, errors.New("go not found on PATH (needed to build guest tests)")
	}
	if h.qemu, err = exec.LookPath("qemu-system-x86_64"); err != nil {
		return nil, errors.New("qemu-system-x86_64 not found (run scripts/deps.sh)")
	}
	if err := os.MkdirAll(o.cache, 0o755); err != nil {
		return nil, err
	}
	t0 := time.Now()
	progress("initramfs: u-root core image (cached by content)")
	if h.initramfs, err = initramfs.Core(h.o.top, filepath.Join(o.cache, "initramfs"), os.Stderr); err != nil {
		return nil, err
	}
	progress("initramfs: %s (%.1fs)", filepath.Base(h.initramfs), time.Since(t0).Seconds())
	patterns := []string(o.pkgs)
	if len(patterns) == 0 {
		patterns = []string{"./tests/guest/...", "./cmd/ovlgraph"}
	}
	if os.Getenv("GOWORK") == "" {
		work, err := initramfs.NestedWorkspace(h.o.top, patterns)
		if err != nil {
			return nil, err
		}
		if work != "" {
			// The go commands below inherit it; ovlvm is the only user
			// of its environment.
			progress("packages: building from the workspace %s", work)
			os.Setenv("GOWORK", work)
		}
	}
	t0 = time.Now()
	if h.pkgs, err = initramfs.ListGuestPackages(ctx, h.goBin, h.o.top, patterns...); err != nil {
		return nil, err
	}
	pruneRuns(o.cache)
	h.runRoot, err = os.MkdirTemp(o.cache, "run-")
	if err != nil {
		return nil, err
	}
	if err := initramfs.BuildTests(ctx, h.goBin, h.o.top, filepath.Join(h.runRoot, "bin"), h.pkgs); err != nil {
		return nil, err
	}
	progress("guest tests: %d packages built (%.1fs)", len(h.pkgs), time.Since(t0).Seconds())
	if h.accel, err = chooseAccel(ctx, o.accel, h.qemu, probeKernel, o.cache); err != nil {
		return nil, err
	}
	return h, nil
}

// chooseAccel turns -accel into an accelerator; "auto" probes with a boot
// of probeKernel, and the answer is cached in the cache directory.
func chooseAccel(ctx context.Context, accel, qemu, probeKernel, cache string) (vm.Accelerator, error) {
	switch accel {
	case "tcg":
		return vm.TCG, nil
	case "kvm":
		return vm.KVM, nil
	case "auto":
		acc, why := vm.DetectAccel(ctx, qemu, probeKernel, filepath.Join(cache, "accel"))
		progress("accelerator: %s (%s)", acc, why)
		return acc, nil
	}
	return vm.TCG, fmt.Errorf("-accel %q: want auto, kvm or tcg", accel)
}

// pruneRuns removes the work directories (logs) of earlier runs once
// they are older than runKeep says.
func pruneRuns(cache string) {
	old, _ := filepath.Glob(filepath.Join(cache, "run-*"))
	for _, d := range old {
		if fi, err := os.Stat(d); err == nil && time.Since(fi.ModTime()) > runKeep(filepath.Base(d)) {
			os.RemoveAll(d)
		}
	}
}

// runKeep is how long the run directory name is kept: an xfstests run's
// for a week, because one part of the generic tests may take sittings on
// several days that "ovlvm xfstests -from" then judges together; any
// other run's for a day.
func runKeep(name string) time.Duration {
	if strings.HasPrefix(name, "run-xfstests-") {
		return 7 * 24 * time.Hour
	}
	return 24 * time.Hour
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "ovlvm: "+format+"\n", args...)
}

// resolveKernel maps a tree name of kernel base kbase to its bzImage
// through scripts/kernel.sh.
func resolveKernel(top, kbase, name string) (string, error) {
	if strings.Contains(name, "/") {
		if _, err := os.Stat(name); err != nil {
			return "", fmt.Errorf("kernel %s: %w", name, err)
		}
		return filepath.Abs(name)
	}
	cmd := exec.Command(filepath.Join(top, "scripts", "kernel.sh"), "path", name)
	cmd.Env = append(os.Environ(), "KBASE="+kbase)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("KBASE=%s kernel.sh path %s: %w", kbase, name, err)
	}
	p := strings.TrimSpace(string(out))
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("kernel %q of base %s is not built (%s missing): run KBASE=%s scripts/kernel.sh build %s",
			name, kbase, p, kbase, name)
	}
	return p, nil
}

func (h *harness) config(label, kernel string, stock bool, extraEnv map[string]string) (vm.Config, error) {
	// OVLKIT_KBASE lets a test that cannot run on a base whose series
	// lacks its patch say so (see Documentation/testing.rst).
	env := map[string]string{"OVLKIT_TEST_TIMEOUT": h.o.testTime.String(), "OVLKIT_KBASE": h.o.kbase}
	if h.o.run != "" {
		env["OVLKIT_RUN"] = h.o.run
	}
	if h.o.bench != "" {
		env["OVLKIT_BENCH"] = h.o.bench
	}
	for _, kv := range h.o.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return vm.Config{}, fmt.Errorf("-env %q: want KEY=VALUE", kv)
		}
		env[k] = v
	}
	for k, v := range extraEnv {
		env[k] = v
	}
	var fss []string
	for _, f := range strings.Split(h.o.fs, ",") {
		if f = strings.TrimSpace(f); f != "" && f != "tmpfs" {
			fss = append(fss, f)
		}
	}
	var console io.Writer
	if h.o.verbose {
		console = prefixWriter(os.Stderr, label)
	}
	return vm.Config{
		Label:       label,
		Kernel:      kernel,
		Initramfs:   h.initramfs,
		Packages:    h.pkgs,
		Files:       h.o.files,
		Stock:       stock,
		Filesystems: fss,
		Env:         env,
		QEMU:        h.qemu,
		Accel:       h.accel,
		MemoryMB:    h.o.mem,
		Timeout:     h.o.timeout,
		WorkDir:     filepath.Join(h.runRoot, label),
		GoBin:       h.goBin,
		Progress:    os.Stderr,
		Console:     console,
	}, nil
}

type linePrefixer struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
}

func prefixWriter(w io.Writer, label string) io.Writer {
	return &linePrefixer{w: w, prefix: label + "| "}
}

func (p *linePrefixer) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := fmt.Fprint(p.w, p.prefix+string(b))
	return len(b), err
}

// report prints the table, writes the machine formats, and turns the
// verdict into the command's error.
func (h *harness) report(results ...*verdict.Result) error {
	scope, err := verdict.LoadProofScope(filepath.Join(h.o.top, "patches"), h.o.kbase)
	if err != nil {
		return err
	}
	for _, r := range results {
		// Proofs of patches this base's series lacks are keeps tests
		// here; list them, so a skip or a failure among them reads as
		// what it is.
		scoped := r.ScopeProofs(scope)
		if len(scoped) == 0 {
			continue
		}
		count := map[verdict.Status]int{}
		for _, t := range scoped {
			count[t.Status]++
		}
		progress("%s: %d tests prove patches that patches/%s lacks, judged as keeps tests here: %d passed, %d failed, %d skipped",
			r.Label, len(scoped), h.o.kbase, count[verdict.Pass], count[verdict.Fail], count[verdict.Skip])
		for _, t := range scoped {
			if t.Status != verdict.Pass {
				progress("    %s %s (%s): %s", t.Package, t.Name, strings.Join(t.Elsewhere, "; "), t.Status)
			}
		}
	}
	fmt.Println()
	report.WriteTable(os.Stdout, results...)
	if h.o.junit != "" {
		if err := report.WriteJUnit(h.o.junit, results...); err != nil {
			return err
		}
		progress("JUnit report: %s", h.o.junit)
	}
	if h.o.jsonOut != "" {
		if err := report.WriteJSON(h.o.jsonOut, results...); err != nil {
			return err
		}
		progress("go test -json events: %s", h.o.jsonOut)
	}
	var failed []string
	for _, r := range results {
		if !r.OK() {
			failed = append(failed, r.Label)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("guest suite failed on: %s", strings.Join(failed, ", "))
	}
	return nil
}

func cmdRun(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	var o options
	o.register(fs)
	kernelName := fs.String("kernel", "patched", "kernel: stock, patched, a tree name, a bzImage path, "+
		"distro (Debian's linux-image of -kbase), or a linux-image .deb")
	modules := fs.String("modules", "", "modules of a modular -kernel: a linux-image .deb, an unpacked package, "+
		"a /lib/modules directory or a release directory in it")
	stock := fs.Bool("stock", false, "judge as the stock kernel (proof tests must fail); default: true for -kernel stock and distro")
	fs.Parse(args)
	kernel, mods, err := resolveGuestKernel(ctx, o, *kernelName, *modules)
	if err != nil {
		return err
	}
	h, err := newHarness(ctx, o, kernel)
	if err != nil {
		return err
	}
	label := kernelLabel(*kernelName)
	c, err := h.config(label, kernel, *stock || *kernelName == "stock" || *kernelName == "distro", nil)
	if err != nil {
		return err
	}
	c.Modules = mods
	res, err := vm.Run(ctx, c)
	if err != nil {
		return err
	}
	return h.report(res)
}

// kernelLabel names a -kernel argument in reports and run directories.
func kernelLabel(name string) string {
	switch {
	case strings.HasSuffix(name, ".deb"):
		return "deb"
	case strings.Contains(name, "/"):
		return "kernel"
	}
	return name
}

// resolveGuestKernel resolves a kernel argument and, for a modular kernel, the
// modules the guest needs: "distro" is Debian's linux-image package of the
// kernel base (scripts/distro-kernel.sh fetches and unpacks it), a .deb is
// unpacked into the cache, anything else is a tree name or bzImage path
// that takes its modules from -modules, if any.
func resolveGuestKernel(ctx context.Context, o options, name, modules string) (string, *initramfs.ModuleSet, error) {
	var kernel string
	switch {
	case name == "distro" || strings.HasSuffix(name, ".deb"):
		var root string
		if name == "distro" {
			cmd := exec.CommandContext(ctx, filepath.Join(o.top, "scripts", "distro-kernel.sh"))
			cmd.Env = append(os.Environ(), "KBASE="+o.kbase, "CACHE="+o.cache)
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err != nil {
				return "", nil, fmt.Errorf("KBASE=%s scripts/distro-kernel.sh: %w", o.kbase, err)
			}
			root = strings.TrimSpace(string(out))
		} else {
			var err error
			if root, err = initramfs.ExtractDeb(ctx, name, o.cache); err != nil {
				return "", nil, err
			}
		}
		k, dir, err := initramfs.FindPackageKernel(root)
		if err != nil {
			return "", nil, err
		}
		kernel = k
		if modules == "" {
			modules = dir
		}
	default:
		k, err := resolveKernel(o.top, o.kbase, name)
		if err != nil {
			return "", nil, err
		}
		kernel = k
	}
	if modules == "" {
		return kernel, nil, nil
	}
	mods, err := initramfs.PrepareModules(ctx, kernel, modules, o.cache)
	if err != nil {
		return "", nil, err
	}
	progress("%s: %s", filepath.Base(kernel), mods.Describe())
	return kernel, mods, nil
}

func cmdTest(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("test", flag.ExitOnError)
	var o options
	o.register(fs)
	patched := fs.String("patched", "patched", "patched kernel")
	stock := fs.String("stock", "stock", "stock kernel: a tree name, a bzImage path, distro (Debian's "+
		"linux-image of -kbase, judged with stock semantics against the patched build) or a linux-image .deb")
	stockModules := fs.String("stock-modules", "", "modules of a modular -stock kernel (see run -modules)")
	fs.Parse(args)
	pk, err := resolveKernel(o.top, o.kbase, *patched)
	if err != nil {
		return err
	}
	sk, stockMods, err := resolveGuestKernel(ctx, o, *stock, *stockModules)
	if err != nil {
		return err
	}
	h, err := newHarness(ctx, o, pk)
	if err != nil {
		return err
	}
	pc, err := h.config("patched", pk, false, nil)
	if err != nil {
		return err
	}
	stockLabel := "stock"
	if *stock == "distro" || stockMods != nil {
		stockLabel = "distro"
	}
	sc, err := h.config(stockLabel, sk, true, nil)
	if err != nil {
		return err
	}
	sc.Modules = stockMods
	// Two guests at once use both host cores; each is single-CPU.
	results := make([]*verdict.Result, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, c := range []vm.Config{pc, sc} {
		wg.Add(1)
		go func(i int, c vm.Config) {
			defer wg.Done()
			results[i], errs[i] = vm.Run(ctx, c)
		}(i, c)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Each run is judged on its own; only the pair shows whether every
	// proof and keeps test was actually compared between the kernels.
	verdict.CompareRuns(results[0], results[1])
	return h.report(results...)
}

func firstLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, "\n")
}

func passFail(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

func cmdJUnit(args []string) error {
	fs := flag.NewFlagSet("junit", flag.ExitOnError)
	out := fs.String("o", "", "JUnit XML output file")
	label := fs.String("label", "host", "name of this run in the report")
	fs.Parse(args)
	evs, err := verdict.ReadEvents(os.Stdin)
	if err != nil {
		return err
	}
	res := verdict.ResultFromEvents(*label, evs)
	report.WriteTable(os.Stdout, res)
	if *out != "" {
		if err := report.WriteJUnit(*out, res); err != nil {
			return err
		}
	}
	if !res.OK() {
		return fmt.Errorf("%s tests failed", *label)
	}
	return nil
}
