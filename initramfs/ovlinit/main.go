// Command ovlinit runs inside the ovlkit guest as u-root's uinit: it runs
// every test binary the host packed into the initramfs, streams their output
// and the kernel log to the host over a virtio console, and ends the VM.
//
// What it says and how is package guestproto, which the host reads the
// stream with too.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/vm/guestproto"
)

func main() {
	log.SetPrefix("ovlinit: ")
	log.SetFlags(0)
	err := run()
	if err != nil {
		log.Print(err)
	}
	unix.Sync()
	// Reboot rather than return to init, which would start a shell and
	// leave the host waiting for its timeout. QEMU runs with -no-reboot, so
	// a reboot ends it; unlike power-off this needs no ACPI in the guest.
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART); err != nil {
		log.Printf("reboot: %v", err)
	}
	select {}
}

func run() error {
	// First of all: with a modular kernel the results console is a
	// module (modules.go).
	modProblems := loadModules()
	mountKernelFS()
	out, err := openResults()
	if err != nil {
		return err
	}
	defer out.Close()
	w := bufio.NewWriter(out)
	defer w.Flush()

	rec := guestproto.Writer{W: w}
	rec.Start(uname())
	for _, p := range modProblems {
		rec.Note(p)
	}
	entries, err := readManifest("/" + guestproto.ManifestPath)
	if err != nil {
		rec.Error(err)
		return err
	}
	timeout := durationEnv("OVLKIT_TEST_TIMEOUT", 10*time.Minute)
	kmsg := openKmsgWriter()
	if kmsg != nil {
		defer kmsg.Close()
	}
	for _, e := range entries {
		runBinary(w, kmsg, e, timeout)
		w.Flush()
	}
	checkLockdep(w)
	dumpKmsg(w)
	rec.Done()
	return nil
}

// mountKernelFS mounts what tests expect beyond u-root's /proc, /sys, /dev
// and /tmp. Failures are logged, not fatal: a kernel without tracing still
// runs the tests that do not need it.
func mountKernelFS() {
	for _, m := range []struct{ src, dir, fstype string }{
		{"debugfs", "/sys/kernel/debug", "debugfs"},
		{"tracefs", "/sys/kernel/tracing", "tracefs"},
	} {
		if err := unix.Mount(m.src, m.dir, m.fstype, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			log.Printf("mount %s on %s: %v", m.fstype, m.dir, err)
		}
	}
}

func openResults() (*os.File, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, err := os.OpenFile(guestproto.ResultsPort, os.O_WRONLY|unix.O_NOCTTY, 0)
		if err == nil {
			rawOutput(f)
			return f, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("open results port: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rawOutput turns off the console's output processing: with the default
// ONLCR every newline would reach the host as CR LF.
func rawOutput(f *os.File) {
	t, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	if err != nil {
		log.Printf("results port termios: %v", err)
		return
	}
	t.Oflag &^= unix.OPOST
	if err := unix.IoctlSetTermios(int(f.Fd()), unix.TCSETS, t); err != nil {
		log.Printf("results port termios: %v", err)
	}
}

func uname() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Version[:])
}

func readManifest(path string) ([]guestproto.Entry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	return guestproto.ParseManifest(string(b))
}

func durationEnv(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
		log.Printf("ignoring %s=%q: not a duration", name, v)
	}
	return def
}

// runBinary runs one test binary with its output framed by begin and end
// records. The test's own -test.timeout makes a hung test panic with a
// goroutine dump; the context kill is the backstop when even that hangs.
// Each test start is also noted in the kernel log (see testMarker), so a
// kernel report can be traced to the test that was running.
func runBinary(w io.Writer, kmsg *os.File, e guestproto.Entry, timeout time.Duration) {
	rec := guestproto.Writer{W: w}
	args := []string{
		"-test.v=test2json",
		"-test.count=1",
		"-test.timeout=" + timeout.String(),
		"-test.run=" + envOr("OVLKIT_RUN", "."),
		"-test.bench=" + envOr("OVLKIT_BENCH", "^$"),
	}
	if v := os.Getenv("OVLKIT_BENCHTIME"); v != "" {
		args = append(args, "-test.benchtime="+v)
	}
	if v := os.Getenv("OVLKIT_BENCHCOUNT"); v != "" {
		args = append(args, "-test.count="+v)
	}
	log.Printf("running %s", e.Pkg)
	rec.Begin(e.Pkg)
	ctx, cancel := context.WithTimeout(context.Background(), timeout+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.Binary, args...)
	cmd.Dir = e.Dir
	out := &testMarker{w: w, kmsg: kmsg, pkg: e.Pkg}
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.Env = append(os.Environ(), "TMPDIR=/tmp")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	err := cmd.Run()
	out.flush()
	code := 0
	if err != nil {
		code = -1
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		rec.BinaryNote(fmt.Sprintf("%s: %v", e.Pkg, err))
	}
	rec.End(e.Pkg, code, time.Since(start).Seconds())
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// dumpKmsg copies the whole kernel log buffer to the host, so it can look
// for splats the console log level hid.
func dumpKmsg(w io.Writer) {
	rec := guestproto.Writer{W: w}
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		rec.Note(fmt.Sprintf("kmsg: %v", err))
		return
	}
	defer unix.Close(fd)
	rec.KmsgBegin()
	buf := make([]byte, 8192)
	for {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EPIPE) {
			continue
		}
		if err != nil {
			break
		}
		fmt.Fprintln(w, formatKmsg(string(buf[:n])))
	}
	rec.KmsgEnd()
}

// formatKmsg turns "6,1234,5678901,-;text\n SUBSYSTEM=..." into
// "[    5.678901] text", the form dmesg prints.
func formatKmsg(rec string) string {
	head, msg, ok := strings.Cut(rec, ";")
	if !ok {
		return strings.TrimRight(rec, "\n")
	}
	msg, _, _ = strings.Cut(msg, "\n")
	f := strings.Split(head, ",")
	if len(f) < 3 {
		return msg
	}
	var usec int64
	fmt.Sscan(f[2], &usec)
	return fmt.Sprintf("[%5d.%06d] %s", usec/1e6, usec%1e6, msg)
}

func openKmsgWriter() *os.File {
	f, err := os.OpenFile("/dev/kmsg", os.O_WRONLY, 0)
	if err != nil {
		log.Printf("kernel log markers: %v", err)
		return nil
	}
	return f
}

// testMarker passes a test binary's output through and writes one kernel
// log line for each test that starts or resumes ("=== RUN", "=== CONT"),
// so the kernel log and the console show which test ran when a kernel
// report came. The line is written when the test announces itself, before
// it does anything, so a report after the marker belongs to that test or a
// later one.
type testMarker struct {
	w       io.Writer
	kmsg    *os.File
	pkg     string
	partial []byte
}

func (m *testMarker) Write(b []byte) (int, error) {
	if m.kmsg != nil {
		m.partial = append(m.partial, b...)
		for {
			i := bytes.IndexByte(m.partial, '\n')
			if i < 0 {
				break
			}
			m.mark(string(m.partial[:i]))
			m.partial = m.partial[i+1:]
		}
	}
	return m.w.Write(b)
}

func (m *testMarker) flush() {
	if len(m.partial) > 0 {
		m.mark(string(m.partial))
		m.partial = nil
	}
}

func (m *testMarker) mark(line string) {
	// -test.v=test2json frames its lines with a leading 0x16.
	line = strings.TrimLeft(line, "\x16")
	for _, p := range []string{"=== RUN ", "=== CONT "} {
		if name, ok := strings.CutPrefix(line, p); ok {
			// <14>: user facility, info level: on the console and in
			// the log, never mistaken for a kernel report.
			fmt.Fprintf(m.kmsg, "<14>%s%s %s\n", guestproto.KmsgMarker, m.pkg, strings.TrimSpace(name))
			return
		}
	}
}

// checkLockdep reports, as a note the host fails the run on, a kernel with
// lockdep whose validator was turned off during the run: lockdep reports
// only the first problem it finds and then stops checking, and other
// reports (KASAN, a taint) turn it off too, so a lockdep report after that
// point was never made. With OVLKIT_LOCKDEP=required a kernel without
// lockdep is an error as well.
func checkLockdep(w io.Writer) {
	rec := guestproto.Writer{W: w}
	b, err := os.ReadFile("/proc/lockdep_stats")
	if err != nil {
		if os.Getenv("OVLKIT_LOCKDEP") == "required" {
			rec.Note(fmt.Sprintf("lockdep: required but the kernel has none: %v", err))
		}
		return
	}
	v, ok := lockdepDebugLocks(string(b))
	switch {
	case !ok:
		rec.Note("lockdep: no debug_locks line in /proc/lockdep_stats")
	case v != 1:
		rec.Note(fmt.Sprintf("lockdep: turned off during the run (debug_locks %d at the end): reports after that point were not made", v))
	default:
		log.Print("lockdep: still on at the end of the run")
	}
}

// lockdepDebugLocks reads the " debug_locks: N" line of /proc/lockdep_stats.
func lockdepDebugLocks(stats string) (int, bool) {
	for _, line := range strings.Split(stats, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != "debug_locks" {
			continue
		}
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(v), &n); err != nil {
			return 0, false
		}
		return n, true
	}
	return 0, false
}
