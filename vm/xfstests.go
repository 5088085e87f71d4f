package vm

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ovlkit/ovlkit/vm/verdict"
)

// The xfstests guest is a second kind of guest: a Debian root filesystem
// with xfstests (scripts/xfstests-image.sh) on a virtio disk instead of
// the u-root initramfs, because xfstests needs bash, perl and a C
// userland. The image's init mounts a small control disk that the host
// writes for each run and runs its run.sh (xfstests_guest.sh), which
// writes xfstests' results back to the same disk.

//go:embed xfstests_guest.sh
var xfstestsGuestScript []byte

// xfstestsScope is systemd-run --scope and systemctl stop for the guest,
// which has no systemd (/ovlkit/scope.sh): check runs each test in a scope
// and stops it afterwards, killing what the test left running.
//
//go:embed xfstests_scope.sh
var xfstestsScope []byte

// guestLib is what the guest scripts share (/ovlkit/lib.sh).
//
//go:embed guest_lib.sh
var guestLib []byte

// ReadersGuestScript is the run.sh of "ovlvm readers": findmnt, dmesg
// and trace-cmd reading what the kernel shows of overlays mounted with
// each option set in OPTION_SETS (readers_guest.sh).
//
//go:embed readers_guest.sh
var ReadersGuestScript []byte

// xfstestsDiskSize is the size of the sparse test and scratch disks; some
// tests want 8 GiB free on the scratch device (overlay/001) or fill it.
const xfstestsDiskSize = 16 << 30

// controlDiskSize is the size of the sparse control disk, which also
// carries the results back: overlay/019's .full alone passes 220 MiB on
// an xfs base.
const controlDiskSize = "2G"

// XfstestsConfig describes one xfstests guest run.
type XfstestsConfig struct {
	Label  string // kernel name in reports
	Kernel string // bzImage
	Image  string // root image from scripts/xfstests-image.sh; never written
	// FS is the base filesystem of the test and scratch disks: ext4 or xfs.
	FS string
	// Check are the arguments for ./check after -overlay: groups (-g
	// quick), tests (overlay/001) or exclusions (-e generic/001).
	Check []string
	// Script replaces the guest's run.sh (xfstests_guest.sh) for other
	// checks that need the Debian userland (ReadersGuestScript); Env
	// lines are appended to the /ovlkit/env it sources.
	Script   []byte
	Env      []string
	QEMU     string
	Accel    Accelerator
	MemoryMB int
	Timeout  time.Duration
	WorkDir  string
	Progress io.Writer
	Console  io.Writer
}

// XfsStatus is the outcome of one xfstests test.
type XfsStatus string

const (
	XfsPass   XfsStatus = "pass"
	XfsFail   XfsStatus = "fail"
	XfsNotRun XfsStatus = "notrun"
)

// XfsTest is one test's result.
type XfsTest struct {
	Name    string // overlay/001, generic/013
	Status  XfsStatus
	Seconds float64
	Message string // why it failed or did not run
	Output  string // the diff and the test's .full output, for failures
}

// XfstestsResult is one kernel's run.
type XfstestsResult struct {
	Label    string
	FS       string
	Uname    string
	Commit   string // xfstests commit the guest ran
	Tests    []XfsTest
	Problems []string // run-level failures: no results, timeout, splats
	Splats   []verdict.Splat
	Seconds  float64
	Serial   string
	Results  string // xfstests' results directory, copied from the guest
	// Subset marks a baseline run that was given only the tests some
	// other kernel did not pass (ovlvm xfstests -baseline failures): a
	// test missing from it passed on every other kernel and cannot be a
	// regression, so comparisons leave it out.
	Subset bool
	// Given are the tests check was given, when the guest's command line
	// names each one (-tests, -part); nil when check expanded a group.
	Given []string
	// Unfinished marks a run whose check wrote no report: the guest was
	// stopped or died, and Tests are the ones the console shows ended.
	Unfinished bool
}

// The problems of a run that was stopped before check finished. They
// hold for that sitting alone: MergeXfstests drops them once later
// sittings have a result for every test the stopped one was given.
const (
	problemNoReport  = "guest wrote no result.xml (check did not finish); results taken from the console"
	problemNoResults = "no results copied back: "
	problemNoTests   = "no xfstests test ran; "
)

// NotPassed lists, in order, every test that did not pass in some run:
// it failed, did not run, or ran on one kernel and is missing from
// another's report.
func NotPassed(runs ...*XfstestsResult) []string {
	passes := map[string]int{}
	for _, r := range runs {
		for _, t := range r.Tests {
			if t.Status == XfsPass {
				passes[t.Name]++
			} else if _, ok := passes[t.Name]; !ok {
				passes[t.Name] = 0
			}
		}
	}
	var out []string
	for n, p := range passes {
		if p < len(runs) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

func (c *XfstestsConfig) progress(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "[%s %s] "+format+"\n", append([]any{c.Label, c.FS}, args...)...)
	}
}

// RunXfstests boots the kernel on a copy-on-write view of the image with
// fresh test, scratch and control disks, runs ./check -overlay, and reads
// the results back. An error means the run could not be set up or its
// results not read; what happened in the guest is in the result.
func RunXfstests(ctx context.Context, c XfstestsConfig) (*XfstestsResult, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.WorkDir, 0o755); err != nil {
		return nil, err
	}
	d, err := c.makeDisks(ctx)
	if err != nil {
		return nil, err
	}
	defer os.Remove(d.test)
	defer os.Remove(d.scratch)
	serialPath := filepath.Join(c.WorkDir, "serial.log")
	c.progress("boot %s on the xfstests image (%s, %d MiB, base %s, ./check -overlay %s)",
		filepath.Base(c.Kernel), c.Accel, c.MemoryMB, c.FS, strings.Join(c.Check, " "))
	b, err := c.boot(ctx, c.qemuArgs(d), serialPath)
	if err != nil {
		return nil, err
	}
	res := &XfstestsResult{Label: c.Label, FS: c.FS, Serial: serialPath, Seconds: b.seconds}
	switch {
	case b.timedOut:
		res.Problems = append(res.Problems, fmt.Sprintf("guest did not finish within %s; last console lines:\n%s",
			c.Timeout, verdict.Tail(b.console, 25)))
	case b.err != nil:
		res.Problems = append(res.Problems, fmt.Sprintf("qemu failed: %v: %s; last console lines:\n%s",
			b.err, b.stderr, verdict.Tail(b.console, 25)))
	}
	c.progress("guest exited after %.1fs", res.Seconds)
	res.readConsole(b.console)
	res.Results = filepath.Join(c.WorkDir, "results")
	if err := readControlResults(ctx, d.control, res.Results); err != nil {
		res.Problems = append(res.Problems, fmt.Sprintf("reading the results disk: %v", err))
	} else {
		_ = os.Remove(d.control)
	}
	if err := res.readResults(b.console); err != nil {
		return res, err
	}
	return res, nil
}

// LoadXfstests reads back one kernel's run from the work directory an
// earlier RunXfstests left (its serial.log and the results copied off the
// control disk), so that a run whose report was lost can be judged again
// without hours of booting. The guest's wall time is not kept on disk, so
// Seconds is zero.
func LoadXfstests(label, fs, workDir string) (*XfstestsResult, error) {
	serialPath := filepath.Join(workDir, "serial.log")
	serial, err := os.ReadFile(serialPath)
	if err != nil {
		return nil, fmt.Errorf("read the run of %s on %s: %w", label, fs, err)
	}
	console := strings.Split(strings.TrimRight(string(serial), "\n"), "\n")
	res := &XfstestsResult{Label: label, FS: fs, Serial: serialPath,
		Results: filepath.Join(workDir, "results")}
	res.readConsole(console)
	if _, err := os.Stat(res.Results); err != nil {
		res.Problems = append(res.Problems, fmt.Sprintf(problemNoResults+"%v", err))
	}
	if err := res.readResults(console); err != nil {
		return res, err
	}
	return res, nil
}

// checkCommand is how xfstests_guest.sh announces check's command line;
// its arguments follow.
const checkCommand = "ovlkit-xfstests: ./check -overlay -R xunit "

// givenTests returns check's arguments when each names a test, and nil
// when they hold a group or an exclusion that check expands itself.
func givenTests(args []string) []string {
	for _, a := range args {
		if !xfstestsName.MatchString(a) {
			return nil
		}
	}
	return args
}

var xfstestsName = regexp.MustCompile(`^(?:overlay|generic)/\d+$`)

// MergeXfstests joins the sittings of one kernel on one base filesystem,
// in the order they ran, into one result: a selection too long for one
// sitting is stopped and the rest given to a later one, or a later
// sitting runs again what an earlier one left unfinished. A test's
// result is the last sitting's that has one. A stopped sitting's
// "check did not finish" problems are dropped when the sittings together
// have a result for every test it was given; check has read the kernel
// log after each of the tests it finished, so the console's results are
// judged as a finished run's. Every other problem is kept, and so are
// those of a stopped sitting whose tests are not all accounted for (a
// group check expanded, whose list the console does not show, never is).
func MergeXfstests(sittings ...*XfstestsResult) (*XfstestsResult, error) {
	if len(sittings) == 0 {
		return nil, errors.New("merge xfstests sittings: none given")
	}
	first := sittings[0]
	m := &XfstestsResult{Label: first.Label, FS: first.FS}
	byName := map[string]XfsTest{}
	var serials []string
	recorded, named := true, true
	given := map[string]bool{}
	for _, s := range sittings {
		if s.Label != m.Label || s.FS != m.FS {
			return nil, fmt.Errorf("merge xfstests sittings: %s on %s with %s on %s", s.Label, s.FS, m.Label, m.FS)
		}
		for _, t := range s.Tests {
			byName[t.Name] = t
		}
		if s.Uname != "" {
			if m.Uname != "" && s.Uname != m.Uname {
				m.Problems = append(m.Problems, fmt.Sprintf("sittings booted different kernels: %s and %s", m.Uname, s.Uname))
			}
			m.Uname = s.Uname
		}
		if s.Commit != "" {
			if m.Commit != "" && s.Commit != m.Commit {
				m.Problems = append(m.Problems, fmt.Sprintf("sittings ran different xfstests: %s and %s", m.Commit, s.Commit))
			}
			m.Commit = s.Commit
		}
		m.Splats = append(m.Splats, s.Splats...)
		m.Seconds += s.Seconds
		recorded = recorded && s.Seconds > 0
		serials = append(serials, s.Serial)
		m.Results = s.Results
		named = named && s.Given != nil
		for _, n := range s.Given {
			if !given[n] {
				given[n] = true
				m.Given = append(m.Given, n)
			}
		}
	}
	if !recorded {
		m.Seconds = 0
	}
	if !named {
		m.Given = nil
	}
	m.Serial = strings.Join(serials, " ")
	for _, s := range sittings {
		if !s.Unfinished {
			m.Problems = append(m.Problems, s.Problems...)
			continue
		}
		var missing []string
		for _, n := range s.Given {
			if _, ok := byName[n]; !ok {
				missing = append(missing, n)
			}
		}
		if s.Given == nil || len(missing) > 0 {
			m.Unfinished = true
			m.Problems = append(m.Problems, s.Problems...)
			if len(missing) > 0 {
				m.Problems = append(m.Problems, fmt.Sprintf("%d tests given to the stopped sitting %s have no result in any sitting: %s",
					len(missing), s.Serial, strings.Join(missing, " ")))
			}
			continue
		}
		for _, p := range s.Problems {
			if p != problemNoReport && !strings.HasPrefix(p, problemNoResults) && !strings.HasPrefix(p, problemNoTests) {
				m.Problems = append(m.Problems, p)
			}
		}
	}
	for _, t := range byName {
		m.Tests = append(m.Tests, t)
	}
	sortXfs(m.Tests)
	return m, nil
}

func (c *XfstestsConfig) validate() error {
	if c.FS != "ext4" && c.FS != "xfs" {
		return fmt.Errorf("xfstests base filesystem %q: want ext4 or xfs", c.FS)
	}
	for _, f := range []string{c.Kernel, c.Image} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("xfstests guest: %w", err)
		}
	}
	for _, a := range c.Check {
		if strings.ContainsAny(a, " \t\n'\"$`\\") {
			return fmt.Errorf("check argument %q: no spaces, quotes or shell characters", a)
		}
	}
	return nil
}

// xfstestsDisks are the images of one xfstests boot besides the root.
type xfstestsDisks struct {
	test, scratch, control string
}

func (c *XfstestsConfig) makeDisks(ctx context.Context) (xfstestsDisks, error) {
	var d xfstestsDisks
	var err error
	if d.test, err = sizedDisk(ctx, c.WorkDir, "test", c.FS, xfstestsDiskSize); err != nil {
		return d, err
	}
	if d.scratch, err = sizedDisk(ctx, c.WorkDir, "scratch", c.FS, xfstestsDiskSize); err != nil {
		os.Remove(d.test)
		return d, err
	}
	script := c.Script
	if script == nil {
		script = xfstestsGuestScript
	}
	if d.control, err = controlDisk(ctx, c.WorkDir, c.FS, c.Check, script, c.Env); err != nil {
		os.Remove(d.test)
		os.Remove(d.scratch)
		return d, err
	}
	return d, nil
}

// qemuArgs is the whole QEMU command line of an xfstests boot. The root
// disk comes first so that it is vda; snapshot=on keeps the guest's
// writes in a temporary file, so the cached image stays clean and two
// kernels can boot it at once. The other disks are found by serial.
func (c *XfstestsConfig) qemuArgs(d xfstestsDisks) []string {
	kargs := []string{"console=ttyS0", "root=/dev/vda", "rw", "rootfstype=ext4",
		"init=/sbin/ovlkit-xfstests-init", "panic=-1", "printk.devkmsg=on", "tsc=reliable"}
	if c.Accel == TCG {
		if khz, ok := hostTSCkHz(); ok {
			kargs = append(kargs, fmt.Sprintf("tsc_early_khz=%d", khz))
		}
	}
	args := []string{"-nodefaults", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-m", fmt.Sprint(c.MemoryMB),
		"-kernel", c.Kernel, "-append", strings.Join(kargs, " "),
		"-drive", "file=" + c.Image + ",if=none,id=root,format=raw,snapshot=on,cache=unsafe",
		"-device", "virtio-blk-pci,drive=root,serial=ovlkit-root"}
	for _, disk := range []struct{ id, img, serial string }{
		{"xtest", d.test, "ovlkit-xfstest"},
		{"xscratch", d.scratch, "ovlkit-xfscratch"},
		{"xctl", d.control, "ovlkit-control"},
	} {
		args = append(args,
			"-drive", fmt.Sprintf("file=%s,if=none,id=%s,format=raw,cache=unsafe", disk.img, disk.id),
			"-device", fmt.Sprintf("virtio-blk-pci,drive=%s,serial=%s", disk.id, disk.serial))
	}
	return append(args, c.Accel.qemuArgs()...)
}

// An xfstestsBoot is how the guest's run ended.
type xfstestsBoot struct {
	console  []string
	seconds  float64
	timedOut bool
	err      error  // QEMU's exit error
	stderr   string // QEMU's own messages
}

// boot runs QEMU with args until the guest ends or c.Timeout passes; the
// serial console goes to serialPath and c.Console.
func (c *XfstestsConfig) boot(ctx context.Context, args []string, serialPath string) (*xfstestsBoot, error) {
	serial, err := os.Create(serialPath)
	if err != nil {
		return nil, err
	}
	defer serial.Close()
	runCtx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	cmd := exec.CommandContext(runCtx, c.QEMU, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", c.QEMU, err)
	}
	b := &xfstestsBoot{console: c.consume(stdout, serial, start)}
	b.err = cmd.Wait()
	b.seconds = time.Since(start).Seconds()
	b.timedOut = errors.Is(runCtx.Err(), context.DeadlineExceeded)
	b.stderr = strings.TrimSpace(stderr.String())
	return b, nil
}

// readConsole takes the kernel reports, the kernel release, the xfstests
// commit and the tests check was given from the console. Both guest
// scripts start with a line "ovlkit-xfstests: kernel 6.1.0, xfstests
// COMMIT, ..." or "ovlkit-readers: kernel ...", and xfstests_guest.sh
// prints check's command line before it runs it.
func (r *XfstestsResult) readConsole(console []string) {
	r.Splats = verdict.FindSplats(console)
	for _, s := range r.Splats {
		r.Problems = append(r.Problems, fmt.Sprintf("kernel %s report:\n%s", s.Kind, strings.Join(s.Excerpt, "\n")))
	}
	for _, l := range console {
		if i := strings.Index(l, checkCommand); i >= 0 {
			r.Given = givenTests(strings.Fields(l[i+len(checkCommand):]))
		}
		marker := "ovlkit-xfstests: kernel "
		if !strings.Contains(l, marker) {
			marker = "ovlkit-readers: kernel "
		}
		if i := strings.Index(l, marker); i >= 0 {
			f := strings.Fields(l[i+len(marker):])
			if len(f) > 0 {
				r.Uname = strings.TrimSuffix(f[0], ",")
			}
			if j := strings.Index(l, "xfstests "); j >= 0 && len(f) > 2 {
				r.Commit = strings.TrimSuffix(f[2], ",")
			}
		}
	}
}

// readResults reads what the guest copied back to r.Results: its kernel
// log (the console shows only a panic's messages, xfstests_guest.sh) and
// check's report, or failing that the tests the console shows.
func (r *XfstestsResult) readResults(console []string) error {
	if kmsg, err := os.ReadFile(filepath.Join(r.Results, "dmesg.txt")); err == nil {
		for _, s := range verdict.FindNewSplats(r.Splats, strings.Split(string(kmsg), "\n")) {
			r.Splats = append(r.Splats, s)
			r.Problems = append(r.Problems, fmt.Sprintf("kernel %s report in the guest's kernel log:\n%s",
				s.Kind, strings.Join(s.Excerpt, "\n")))
		}
	}
	xml, xerr := os.ReadFile(filepath.Join(r.Results, "result.xml"))
	if xerr == nil {
		var err error
		if r.Tests, err = parseXfstestsXunit(xml); err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(r.Results, "result.xml"), err)
		}
	}
	if len(r.Tests) == 0 {
		// No report (the guest died mid-run): take what the console shows.
		r.Tests = parseCheckConsole(console)
		if xerr != nil {
			r.Unfinished = true
			r.Problems = append(r.Problems, problemNoReport)
		}
	}
	if len(r.Tests) == 0 {
		r.Problems = append(r.Problems, fmt.Sprintf(problemNoTests+"last console lines:\n%s", verdict.Tail(console, 25)))
	}
	return nil
}

// xfstestsLine is a line check prints when a test ends.
var xfstestsLine = regexp.MustCompile(`^((?:overlay|generic)/\d+)\s+(.*)$`)

// checkTime is the time check prints last on a passing test's line: that
// run's, after the previous run's and "...".
var checkTime = regexp.MustCompile(`(?:^|\s)(\d+)s$`)

// consume stores the console, passes it on, and reports each finished test.
func (c *XfstestsConfig) consume(r io.Reader, log io.Writer, start time.Time) []string {
	var lines []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		fmt.Fprintln(log, line)
		if c.Console != nil {
			fmt.Fprintln(c.Console, line)
		}
		lines = append(lines, line)
		if m := xfstestsLine.FindStringSubmatch(line); m != nil {
			n++
			c.progress("%4d %s %s (%.0fs)", n, m[1], strings.TrimSpace(m[2]), time.Since(start).Seconds())
		} else if i := strings.Index(line, "ovlkit-xfstests: "); i >= 0 {
			c.progress("guest: %s (%.0fs)", line[i+len("ovlkit-xfstests: "):], time.Since(start).Seconds())
		}
	}
	_, _ = io.Copy(io.Discard, r)
	return lines
}

// sizedDisk makes a sparse image of size formatted with fs.
func sizedDisk(ctx context.Context, dir, name, fs string, size int64) (string, error) {
	cmdline, ok := mkfs[fs]
	if !ok {
		return "", fmt.Errorf("no disk filesystem %q", fs)
	}
	img := filepath.Join(dir, name+"-"+fs+".img")
	f, err := os.Create(img)
	if err != nil {
		return "", err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	if out, err := exec.CommandContext(ctx, cmdline[0], append(cmdline[1:], img)...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("%s %s: %v: %s", cmdline[0], img, err, out)
	}
	return img, nil
}

// controlDisk writes the guest's run.sh and its settings into a small
// ext4 image (mkfs.ext4 -d, so no loop device is needed on the host).
func controlDisk(ctx context.Context, dir, fs string, check []string, script []byte, extraEnv []string) (string, error) {
	src := filepath.Join(dir, "control")
	if err := os.RemoveAll(src); err != nil {
		return "", err
	}
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	env := fmt.Sprintf("FSTYP=%s\nCHECK_ARGS='%s'\n", fs, strings.Join(check, " "))
	for _, e := range extraEnv {
		env += e + "\n"
	}
	if err := os.WriteFile(filepath.Join(src, "env"), []byte(env), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "lib.sh"), guestLib, 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "scope.sh"), xfstestsScope, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "run.sh"), script, 0o755); err != nil {
		return "", err
	}
	img := filepath.Join(dir, "control.img")
	_ = os.Remove(img)
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-d", src, img, controlDiskSize).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("mkfs.ext4 -d %s: %v: %s", src, err, out)
	}
	return img, os.RemoveAll(src)
}

// readControlResults copies /results off the control disk with debugfs,
// which reads ext4 images without mounting them.
func readControlResults(ctx context.Context, img, dst string) error {
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	_ = os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "debugfs", "-R", "rdump /results "+tmp, img).CombinedOutput()
	if err != nil {
		return fmt.Errorf("debugfs rdump: %v: %s", err, out)
	}
	if _, err := os.Stat(filepath.Join(tmp, "results")); err != nil {
		return fmt.Errorf("no results on the control disk (the guest never finished check): %s", strings.TrimSpace(string(out)))
	}
	if err := os.Rename(filepath.Join(tmp, "results"), dst); err != nil {
		return err
	}
	return os.RemoveAll(tmp)
}

// xfstests' xunit report (common/report).
type xunitSuite struct {
	Cases []struct {
		Name    string  `xml:"name,attr"`
		Time    float64 `xml:"time,attr"`
		Skipped *struct {
			Message string `xml:"message,attr"`
		} `xml:"skipped"`
		Failure *struct {
			Message string `xml:"message,attr"`
			Type    string `xml:"type,attr"`
		} `xml:"failure"`
		SystemOut string `xml:"system-out"`
		SystemErr string `xml:"system-err"`
		KernelLog string `xml:"kernel-log"`
	} `xml:"testcase"`
}

func parseXfstestsXunit(b []byte) ([]XfsTest, error) {
	var s xunitSuite
	if err := xml.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parse xunit report: %w", err)
	}
	var tests []XfsTest
	for _, tc := range s.Cases {
		t := XfsTest{Name: tc.Name, Status: XfsPass, Seconds: tc.Time}
		switch {
		case tc.Failure != nil:
			t.Status = XfsFail
			t.Message = tc.Failure.Message
			// The diff first: it is what a reader needs; then the
			// kernel log when check found something there, then .full.
			t.Output = strings.TrimSpace(strings.Join([]string{tc.SystemErr, tc.KernelLog, tc.SystemOut}, "\n"))
		case tc.Skipped != nil:
			t.Status = XfsNotRun
			t.Message = tc.Skipped.Message
		}
		tests = append(tests, t)
	}
	sortXfs(tests)
	return tests, nil
}

// parseCheckConsole reads check's per-test lines: "overlay/001 2s ...  1s",
// "overlay/002       [not run] reason", "generic/003 - output mismatch
// (see ...)", "[failed, exit status 1]" and the like.
func parseCheckConsole(lines []string) []XfsTest {
	var tests []XfsTest
	seen := map[string]int{}
	for i, l := range lines {
		m := xfstestsLine.FindStringSubmatch(strings.TrimSpace(l))
		if m == nil {
			continue
		}
		t := XfsTest{Name: m[1], Status: XfsPass}
		rest := m[2]
		switch {
		case strings.Contains(rest, "[not run]"):
			t.Status = XfsNotRun
			t.Message = strings.TrimSpace(rest[strings.Index(rest, "[not run]")+len("[not run]"):])
		case strings.Contains(rest, "[expunged]"):
			t.Status = XfsNotRun
			t.Message = "expunged"
		case strings.Contains(rest, "[failed") || strings.Contains(rest, "output mismatch") ||
			strings.Contains(rest, "_check_"):
			t.Status = XfsFail
			t.Message = rest
			var out []string
			for _, o := range lines[i+1:] {
				if xfstestsLine.MatchString(strings.TrimSpace(o)) || strings.HasPrefix(o, "Ran:") {
					break
				}
				out = append(out, o)
			}
			t.Output = strings.Join(out, "\n")
		default:
			if m := checkTime.FindStringSubmatch(rest); m != nil {
				t.Seconds, _ = strconv.ParseFloat(m[1], 64)
			}
		}
		if j, ok := seen[t.Name]; ok {
			tests[j] = t
			continue
		}
		seen[t.Name] = len(tests)
		tests = append(tests, t)
	}
	sortXfs(tests)
	return tests
}

func sortXfs(tests []XfsTest) {
	sort.Slice(tests, func(i, j int) bool { return tests[i].Name < tests[j].Name })
}

// Counts returns passed, failed and not-run numbers.
func (r *XfstestsResult) Counts() (pass, fail, notrun int) {
	for _, t := range r.Tests {
		switch t.Status {
		case XfsPass:
			pass++
		case XfsFail:
			fail++
		default:
			notrun++
		}
	}
	return
}

// XfsDiff is a test whose outcome differs between two kernels.
type XfsDiff struct {
	Name         string
	Base, Other  *XfsTest // nil when the test did not appear in that run
	Regression   bool     // passes on Base, fails on Other
	Fix          bool     // fails on Base, passes on Other
	NotRunChange bool     // runs on one, not on the other
}

// CompareXfstests lists every test whose outcome differs between base
// (the stock kernel) and other (the patched one). When base is a Subset,
// the tests it was not given are left out.
func CompareXfstests(base, other *XfstestsResult) []XfsDiff {
	idx := func(r *XfstestsResult) map[string]*XfsTest {
		m := map[string]*XfsTest{}
		for i := range r.Tests {
			m[r.Tests[i].Name] = &r.Tests[i]
		}
		return m
	}
	b, o := idx(base), idx(other)
	names := map[string]bool{}
	for n := range b {
		names[n] = true
	}
	for n := range o {
		names[n] = true
	}
	var sorted []string
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	var diffs []XfsDiff
	for _, n := range sorted {
		bt, ot := b[n], o[n]
		if bt == nil && base.Subset {
			continue
		}
		st := func(t *XfsTest) XfsStatus {
			if t == nil {
				return "missing"
			}
			return t.Status
		}
		bs, os := st(bt), st(ot)
		if bs == os {
			continue
		}
		d := XfsDiff{Name: n, Base: bt, Other: ot}
		switch {
		case bs == XfsPass && os != XfsNotRun:
			// A test that passed on stock and failed, or vanished
			// because the guest died, on patched.
			d.Regression = true
		case bs == XfsFail && os == XfsPass:
			d.Fix = true
		default:
			d.NotRunChange = true
		}
		diffs = append(diffs, d)
	}
	return diffs
}

// WriteXfstestsTable writes a reStructuredText table with one row per
// test and a column per run, then, for every test that did not pass
// somewhere, xfstests' message for it: why it failed or did not run.
func WriteXfstestsTable(w io.Writer, runs ...*XfstestsResult) {
	byName := map[string][]*XfsTest{}
	for i, r := range runs {
		for j := range r.Tests {
			t := &r.Tests[j]
			if byName[t.Name] == nil {
				byName[t.Name] = make([]*XfsTest, len(runs))
			}
			byName[t.Name][i] = t
		}
	}
	var names []string
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	width := []int{len("test")}
	for _, n := range names {
		width[0] = max(width[0], len(n))
	}
	head := []string{"test"}
	for _, r := range runs {
		head = append(head, r.Label+" ("+r.FS+")")
	}
	cell := func(t *XfsTest) string {
		if t == nil {
			return "-"
		}
		if t.Status == XfsPass {
			return fmt.Sprintf("pass %.0fs", t.Seconds)
		}
		return string(t.Status)
	}
	for i := range runs {
		wd := len(head[i+1])
		for _, n := range names {
			wd = max(wd, len(cell(byName[n][i])))
		}
		width = append(width, wd)
	}
	rule := func() {
		var parts []string
		for _, wd := range width {
			parts = append(parts, strings.Repeat("=", wd))
		}
		fmt.Fprintln(w, strings.Join(parts, "  "))
	}
	row := func(cols []string) {
		var parts []string
		for i, c := range cols {
			parts = append(parts, fmt.Sprintf("%-*s", width[i], c))
		}
		fmt.Fprintln(w, strings.TrimRight(strings.Join(parts, "  "), " "))
	}
	rule()
	row(head)
	rule()
	for _, n := range names {
		cols := []string{n}
		for i := range runs {
			cols = append(cols, cell(byName[n][i]))
		}
		row(cols)
	}
	rule()
	writeXfsReasons(w, names, byName, runs)
}

// writeXfsReasons writes a definition list of the tests that failed or
// did not run in some run, with xfstests' message. Runs that agree on
// the outcome and the message share a line, so a test not run alike on
// both kernels reads as one reason.
func writeXfsReasons(w io.Writer, names []string, byName map[string][]*XfsTest, runs []*XfstestsResult) {
	first := true
	for _, n := range names {
		type reason struct {
			labels []string
			text   string
		}
		var reasons []reason
		for i, t := range byName[n] {
			if t == nil || t.Status == XfsPass {
				continue
			}
			text := string(t.Status)
			if m := firstLine(t.Message); m != "" && !strings.Contains(m, "``") {
				text += ": ``" + m + "``"
			}
			j := 0
			for j < len(reasons) && reasons[j].text != text {
				j++
			}
			if j == len(reasons) {
				reasons = append(reasons, reason{text: text})
			}
			reasons[j].labels = append(reasons[j].labels, runs[i].Label)
		}
		if len(reasons) == 0 {
			continue
		}
		if first {
			fmt.Fprintf(w, "\nWhat did not pass, with xfstests' message:\n\n")
			first = false
		}
		fmt.Fprintln(w, n)
		for _, r := range reasons {
			fmt.Fprintf(w, "   - %s: %s\n", strings.Join(r.labels, ", "), r.text)
		}
	}
}

// WriteXfstestsJUnit writes every run as a test suite named after its
// kernel and base filesystem.
func WriteXfstestsJUnit(path string, runs ...*XfstestsResult) error {
	type failure struct {
		Message string `xml:"message,attr"`
		Body    string `xml:",chardata"`
	}
	type skipped struct {
		Message string `xml:"message,attr"`
	}
	type testcase struct {
		Name      string   `xml:"name,attr"`
		Classname string   `xml:"classname,attr"`
		Time      string   `xml:"time,attr"`
		Failure   *failure `xml:"failure,omitempty"`
		Skipped   *skipped `xml:"skipped,omitempty"`
	}
	type suite struct {
		Name     string     `xml:"name,attr"`
		Tests    int        `xml:"tests,attr"`
		Failures int        `xml:"failures,attr"`
		Skipped  int        `xml:"skipped,attr"`
		Time     string     `xml:"time,attr"`
		Cases    []testcase `xml:"testcase"`
	}
	type suites struct {
		XMLName xml.Name `xml:"testsuites"`
		Suites  []suite  `xml:"testsuite"`
	}
	var all suites
	for _, r := range runs {
		s := suite{Name: fmt.Sprintf("xfstests-overlay.%s.%s", r.Label, r.FS), Time: fmt.Sprintf("%.1f", r.Seconds)}
		for _, t := range r.Tests {
			tc := testcase{Name: t.Name, Classname: s.Name, Time: fmt.Sprintf("%.0f", t.Seconds)}
			switch t.Status {
			case XfsFail:
				tc.Failure = &failure{Message: t.Message, Body: t.Output}
				s.Failures++
			case XfsNotRun:
				tc.Skipped = &skipped{Message: t.Message}
				s.Skipped++
			}
			s.Cases = append(s.Cases, tc)
			s.Tests++
		}
		for i, p := range r.Problems {
			s.Cases = append(s.Cases, testcase{Name: fmt.Sprintf("run-problem-%d", i+1), Classname: s.Name,
				Time: "0", Failure: &failure{Message: firstLine(p), Body: p}})
			s.Tests++
			s.Failures++
		}
		all.Suites = append(all.Suites, s)
	}
	b, err := xml.MarshalIndent(all, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append([]byte(xml.Header), append(b, '\n')...), 0o644)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
