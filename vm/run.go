// Package vm is the host side of ovlkit's test harness: it boots a kernel
// with a u-root initramfs carrying guest test binaries in QEMU, attaches
// scratch disks, and turns what comes back into judged test results.
package vm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hugelgupf/vmtest/qemu"

	"github.com/ovlkit/ovlkit/vm/guestproto"
)

// Config describes one guest run.
type Config struct {
	Label     string // kernel name in reports: stock, patched, ...
	Kernel    string // bzImage
	Initramfs string // core image from CoreInitramfs
	Packages  []Package
	// Modules, for a kernel whose drivers are modules, are packed into
	// the initramfs and loaded by the guest before anything else.
	Modules *ModuleSet
	// Stock marks the unpatched kernel: proof tests must fail there.
	Stock bool
	// Filesystems are the disks to attach (tmpfs needs none).
	Filesystems []string
	// Env reaches the guest tests as environment variables through the
	// kernel command line (no spaces in values).
	Env      map[string]string
	QEMU     string // qemu-system-x86_64
	Accel    Accelerator
	MemoryMB int
	Timeout  time.Duration // for the whole VM
	WorkDir  string        // disks, initrd, serial log and results
	GoBin    string        // go, for test2json
	// Progress receives one line per phase; Console, when set, receives
	// the guest's serial console as it arrives.
	Progress io.Writer
	Console  io.Writer
}

// Result is a judged guest run.
type Result struct {
	Label    string
	Uname    string
	Tests    []*Test
	Events   []Event
	Splats   []Splat
	Problems []string // run-level failures, each a sentence
	Seconds  float64
	Serial   string // path of the serial log
	Kmsg     []string
}

// OK reports whether the run passed: every test judged pass, skip or
// expected-fail, and no run-level problem.
func (r *Result) OK() bool {
	if len(r.Problems) > 0 {
		return false
	}
	for _, t := range r.Tests {
		switch t.Status {
		case Pass, Skip, ExpectedFail:
		default:
			return false
		}
	}
	return true
}

func (c *Config) progress(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "[%s] "+format+"\n", append([]any{c.Label}, args...)...)
	}
}

// Run boots the guest and returns its judged results. An error means the
// run could not be set up; everything that happened in the guest, good or
// bad, is in the Result.
func Run(ctx context.Context, c Config) (*Result, error) {
	if err := os.MkdirAll(c.WorkDir, 0o755); err != nil {
		return nil, err
	}
	if _, err := os.Stat(c.Kernel); err != nil {
		return nil, fmt.Errorf("kernel %s: %w", c.Kernel, err)
	}
	initrd := filepath.Join(c.WorkDir, "initrd.cpio")
	if err := writeInitrd(ctx, initrd, c.Initramfs, c.Packages, c.Modules); err != nil {
		return nil, err
	}
	var qargs []string
	for i, fs := range c.Filesystems {
		img, err := makeDisk(ctx, c.WorkDir, fs)
		if err != nil {
			return nil, err
		}
		// The images only matter while the guest runs; the logs stay.
		defer os.Remove(img)
		qargs = append(qargs, diskArgs(i, fs, img)...)
	}
	defer os.Remove(initrd)
	resultsPath := filepath.Join(c.WorkDir, "results.txt")
	_ = os.Remove(resultsPath)
	qargs = append(qargs,
		"-m", fmt.Sprint(c.MemoryMB),
		"-no-reboot",
		"-device", "virtio-serial-pci",
		"-chardev", "file,id=results,path="+resultsPath,
		"-device", "virtconsole,chardev=results",
	)
	qargs = append(qargs, c.Accel.qemuArgs()...)

	kargs, err := c.kernelArgs()
	if err != nil {
		return nil, err
	}

	serialPath := filepath.Join(c.WorkDir, "serial.log")
	serialFile, err := os.Create(serialPath)
	if err != nil {
		return nil, err
	}
	defer serialFile.Close()
	lines := &lineCollector{progress: c.progress, start: time.Now()}
	pr, pw := io.Pipe()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		lines.consume(pr, serialFile, c.Console)
	}()

	c.progress("boot %s (%s, %d MiB, disks: %s)", filepath.Base(c.Kernel), c.Accel, c.MemoryMB,
		strings.Join(append([]string{"tmpfs"}, c.Filesystems...), ","))
	start := time.Now()
	vm, err := qemu.StartContext(ctx, qemu.ArchAMD64,
		qemu.WithQEMUCommand(c.QEMU),
		qemu.WithKernel(c.Kernel),
		qemu.WithInitramfs(initrd),
		qemu.WithAppendKernel(kargs...),
		qemu.ArbitraryArgs(qargs...),
		qemu.WithVMTimeout(c.Timeout),
		qemu.WithSerialOutput(pw),
	)
	if err != nil {
		pw.Close()
		wg.Wait()
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	waitErr := vm.Wait()
	pw.Close()
	wg.Wait()
	res := &Result{Label: c.Label, Serial: serialPath, Seconds: time.Since(start).Seconds()}
	timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded) || res.Seconds >= c.Timeout.Seconds()
	switch {
	case timedOut:
		res.Problems = append(res.Problems, fmt.Sprintf(
			"guest did not finish within %s; last console lines:\n%s", c.Timeout, lines.tail(25)))
	case waitErr != nil:
		res.Problems = append(res.Problems, fmt.Sprintf("qemu failed: %v; last console lines:\n%s", waitErr, lines.tail(25)))
	}
	c.progress("guest exited after %.1fs", res.Seconds)

	if err := res.judge(c, resultsPath, lines.all()); err != nil {
		return res, err
	}
	return res, nil
}

// kernelArgs is the guest kernel's command line: the console, a panic
// that ends the VM, the clock, and c.Env for the guest tests.
func (c *Config) kernelArgs() ([]string, error) {
	// tsc=reliable: without ACPI the guest has no HPET or PM timer to
	// check the TSC against and would fall back to jiffies, a 4 ms clock
	// that makes every duration the tests measure read as zero.
	kargs := []string{"console=ttyS0", "panic=-1", "oops=panic", "printk.devkmsg=on",
		"tsc=reliable", "OVLKIT_GUEST=1"}
	// Under TCG the guest reads the host's TSC, and calibrating it
	// against the emulated PIT fails now and then on a busy host (jiffies
	// again) or lands far off (375 MHz for a 2.6 GHz TSC was seen), which
	// would skew every benchmark. Where the host knows its TSC frequency,
	// hand it over.
	if c.Accel == TCG {
		if khz, ok := hostTSCkHz(); ok {
			kargs = append(kargs, fmt.Sprintf("tsc_early_khz=%d", khz))
		}
	}
	keys := make([]string, 0, len(c.Env))
	for k := range c.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := c.Env[k]
		if strings.ContainsAny(v, " \t\n\"") {
			return nil, fmt.Errorf("guest environment %s=%q: values cannot contain spaces or quotes", k, v)
		}
		kargs = append(kargs, k+"="+v)
	}
	return kargs, nil
}

// judge reads what the guest sent and decides what passed.
func (r *Result) judge(c Config, resultsPath string, console []string) error {
	f, err := os.Open(resultsPath)
	if err != nil {
		r.Problems = append(r.Problems, fmt.Sprintf(
			"guest sent no results (the kernel never reached the test runner?); last console lines:\n%s",
			lastLines(console, 25)))
		r.Splats = FindSplats(console)
		return nil
	}
	defer f.Close()
	g, err := guestproto.Parse(f)
	if err != nil {
		return err
	}
	r.Uname = g.Kernel
	r.Kmsg = g.Kmsg
	for _, b := range g.Binaries {
		evs, err := toEvents(c.GoBin, b.Pkg, b.Output)
		if err != nil {
			return err
		}
		r.Events = append(r.Events, evs...)
		switch {
		case !b.Ended:
			r.Problems = append(r.Problems, fmt.Sprintf("%s: test binary did not finish (guest died?)", b.Pkg))
		case b.ExitCode != 0 && !hasFailure(evs):
			r.Problems = append(r.Problems, fmt.Sprintf("%s: test binary exited %d without reporting a failed test (a panic or its -test.timeout):\n%s",
				b.Pkg, b.ExitCode, lastLines(strings.Split(string(b.Output), "\n"), 20)))
		}
	}
	for _, n := range g.Notes {
		if strings.Contains(n, "exit status") || strings.Contains(n, "signal") {
			continue // already reported through the binary's exit code
		}
		if strings.HasPrefix(n, "lockdep: turned off") {
			// Say what turned it off, and during which test.
			causes := LockdepOffCauses(g.Kmsg)
			if len(causes) == 0 {
				causes = LockdepOffCauses(console)
			}
			if len(causes) > 0 {
				n += "; turned off by:\n    " + strings.Join(causes, "\n    ")
			}
		}
		r.Problems = append(r.Problems, "guest: "+n)
	}
	if !g.Done {
		r.Problems = append(r.Problems, fmt.Sprintf(
			"guest did not complete its run (panic or hang?); last console lines:\n%s", lastLines(console, 25)))
	}
	seen := map[string]bool{}
	for _, set := range [][]string{g.Kmsg, console} {
		for _, s := range FindSplats(set) {
			key := s.Kind + "\x00" + stripTimestamp(s.Excerpt[0])
			if !seen[key] {
				seen[key] = true
				r.Splats = append(r.Splats, s)
			}
		}
	}
	for _, s := range r.Splats {
		r.Problems = append(r.Problems, fmt.Sprintf("kernel %s report while %s was running:\n%s",
			s.Kind, orNone(s.Test), strings.Join(s.Excerpt, "\n")))
	}
	r.Tests = collectTests(r.Events)
	r.Problems = append(r.Problems, judge(r.Tests, c.Stock)...)
	if len(r.Tests) == 0 && len(c.Packages) > 0 && len(r.Problems) == 0 {
		r.Problems = append(r.Problems, "no test ran (does the -run pattern match anything?)")
	}
	return nil
}

func stripTimestamp(s string) string {
	if i := strings.Index(s, "] "); i >= 0 && strings.HasPrefix(strings.TrimSpace(s), "[") {
		return s[i+2:]
	}
	return s
}

func hasFailure(evs []Event) bool {
	for _, e := range evs {
		if e.Action == "fail" && e.Test != "" {
			return true
		}
	}
	return false
}

func lastLines(lines []string, n int) string {
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

// lineCollector keeps the serial console, writes it to the log, and turns
// ovlinit's announcements into progress lines.
type lineCollector struct {
	mu       sync.Mutex
	lines    []string
	progress func(string, ...any)
	start    time.Time
}

func (l *lineCollector) consume(r io.Reader, log io.Writer, console io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		fmt.Fprintln(log, line)
		if console != nil {
			fmt.Fprintln(console, line)
		}
		l.mu.Lock()
		l.lines = append(l.lines, line)
		l.mu.Unlock()
		if i := strings.Index(line, "ovlinit: "); i >= 0 && l.progress != nil {
			l.progress("guest: %s (%.1fs after boot)", line[i+len("ovlinit: "):], time.Since(l.start).Seconds())
		}
	}
	_, _ = io.Copy(io.Discard, r)
}

func (l *lineCollector) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

func (l *lineCollector) tail(n int) string {
	return lastLines(l.all(), n)
}
