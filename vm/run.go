// Package vm is the host side of ovlkit's test harness: it boots a kernel
// in QEMU with an initramfs carrying guest test binaries (package
// initramfs), attaches scratch disks, and has what comes back judged
// (package verdict). It also runs the hard cuts and the Debian guest of
// xfstests and the real readers.
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

	"github.com/ovlkit/ovlkit/vm/initramfs"
	"github.com/ovlkit/ovlkit/vm/verdict"
)

// Config describes one guest run.
type Config struct {
	Label     string // kernel name in reports: stock, patched, ...
	Kernel    string // bzImage
	Initramfs string // core image from Core
	Packages  []initramfs.Package
	// Files are extra host files the guest tests use, packed with them.
	Files []initramfs.File
	// Modules, for a kernel whose drivers are modules, are packed into
	// the initramfs and loaded by the guest before anything else.
	Modules *initramfs.ModuleSet
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

func (c *Config) progress(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "[%s] "+format+"\n", append([]any{c.Label}, args...)...)
	}
}

// Run boots the guest and returns its judged results. An error means the
// run could not be set up; everything that happened in the guest, good or
// bad, is in the verdict.Result.
func Run(ctx context.Context, c Config) (*verdict.Result, error) {
	if err := os.MkdirAll(c.WorkDir, 0o755); err != nil {
		return nil, err
	}
	if _, err := os.Stat(c.Kernel); err != nil {
		return nil, fmt.Errorf("kernel %s: %w", c.Kernel, err)
	}
	initrd := filepath.Join(c.WorkDir, "initrd.cpio")
	if err := initramfs.Write(ctx, initrd, c.Initramfs, c.Packages, c.Files, c.Modules); err != nil {
		return nil, err
	}
	defer os.Remove(initrd)
	// The images only matter while the guest runs; the logs stay.
	disks, err := c.makeDisks(ctx)
	if err != nil {
		return nil, err
	}
	defer removeDisks(disks)
	resultsPath := resultsFile(c.WorkDir, "results.txt")
	serialPath := filepath.Join(c.WorkDir, "serial.log")

	c.progress("boot %s (%s, %d MiB, disks: %s)", filepath.Base(c.Kernel), c.Accel, c.MemoryMB,
		strings.Join(append([]string{"tmpfs"}, c.Filesystems...), ","))
	m, err := c.startMachine(ctx, initrd, serialPath, c.qemuArgs(disks, resultsPath), c.progress)
	if err != nil {
		return nil, err
	}
	seconds, waitErr := m.wait()
	res := &verdict.Result{Label: c.Label, Serial: serialPath, Seconds: seconds}
	timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded) || res.Seconds >= c.Timeout.Seconds()
	switch {
	case timedOut:
		res.Problems = append(res.Problems, fmt.Sprintf(
			"guest did not finish within %s; last console lines:\n%s", c.Timeout, m.lines.tail(25)))
	case waitErr != nil:
		res.Problems = append(res.Problems, fmt.Sprintf("qemu failed: %v; last console lines:\n%s", waitErr, m.lines.tail(25)))
	}
	c.progress("guest exited after %.1fs", res.Seconds)

	err = res.JudgeGuest(resultsPath, m.console(), verdict.Judging{GoBin: c.GoBin, Stock: c.Stock, ExpectTests: len(c.Packages) > 0})
	return res, err
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
	return verdict.Tail(l.all(), n)
}
