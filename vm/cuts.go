package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hugelgupf/vmtest/qemu"
	"github.com/ovlkit/ovlkit/vm/guestproto"
	"github.com/ovlkit/ovlkit/vm/initramfs"
	"github.com/ovlkit/ovlkit/vm/verdict"
)

// Hard cuts: the guest runs a store workload on persistent ext4 and xfs
// disks, the host kills QEMU at a seeded random moment, and the next boot
// of the same disks mounts them (the journal or log is replayed), opens
// the store (its recovery runs) and reports what it holds; the host
// judges that against what the workload acknowledged before the kill
// (cutModel) and checks the filesystems with their own checker, read-only,
// while the guest waits with them unmounted. Then the same boot runs the
// workload for the next cut. Boot n checks cut n-1 and makes cut n; the
// last boot only checks.
//
// What a kill takes: the guest's memory, so everything the guest kernel
// had not yet sent to its disks. The disks are files on the host
// (cache=unsafe), so whatever the guest had sent survives, in order; a
// drive's volatile write cache losing or reordering flushed-but-unwritten
// blocks is what the dm-log-writes replay (tests/guest/crash) covers.

// CutsConfig describes a run of hard cuts. Config gives the kernel, the
// initramfs, the guest package (tests/guest/cuts), the filesystems, QEMU,
// the memory, the work directory and, in Timeout, the limit for each boot.
type CutsConfig struct {
	Config
	Count int    // cuts to make
	Seed  uint64 // cut i uses Seed+i for its moment and its workload
	// MaxDelay bounds the moment of a cut, counted from the workload's
	// start on every disk.
	MaxDelay time.Duration
	// KeepGoing goes on after a cut whose check failed.
	KeepGoing bool
}

// CutsResult is what a run of hard cuts found.
type CutsResult struct {
	Seed     uint64
	Cuts     int // cuts made and checked
	PerFS    []*CutsFS
	Failures []string // every violation, prefixed with its cut and seed
	Seconds  float64
	BootSecs []float64 // each boot's wall time
}

// CutsFS sums one filesystem's cuts.
type CutsFS struct {
	FS           string
	Cuts, Failed int
	Acked        int // operations acknowledged in all
	Layers       int // layers checked in all
	Fsck         int // checker runs, all of them clean unless counted in Failed
	MountMillis  []int64
}

// OK reports whether every cut checked clean.
func (r *CutsResult) OK() bool { return len(r.Failures) == 0 }

// bootOutcome is what one boot sent and what became of it.
type bootOutcome struct {
	reports  map[string]guestproto.CutReport
	acks     map[string][]guestproto.CutAck
	lastOp   map[string]string
	fails    []string // guest-side failures and protocol problems
	fsck     map[string]string
	delay    time.Duration
	killed   bool
	seconds  float64
	problems []string // the boot itself went wrong (no results, a splat)
}

// RunCuts makes c.Count cuts and checks each.
func RunCuts(ctx context.Context, c CutsConfig) (*CutsResult, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.WorkDir, 0o755); err != nil {
		return nil, err
	}
	initrd := filepath.Join(c.WorkDir, "initrd.cpio")
	if err := initramfs.Write(ctx, initrd, c.Initramfs, c.Packages, c.Files, c.Modules); err != nil {
		return nil, err
	}
	defer os.Remove(initrd)
	disks, err := c.makeDisks(ctx)
	if err != nil {
		return nil, err
	}
	res := &CutsResult{Seed: c.Seed}
	models := map[string]*cutModel{}
	for _, fs := range c.Filesystems {
		models[fs] = newCutModel()
		res.PerFS = append(res.PerFS, &CutsFS{FS: fs})
	}
	start := time.Now()
	for boot := 0; boot <= c.Count; boot++ {
		seed := c.Seed + uint64(boot)
		out, err := c.boot(ctx, boot, seed, boot < c.Count, initrd, disks)
		if err != nil {
			return res, err
		}
		res.BootSecs = append(res.BootSecs, out.seconds)
		// This boot's check judges the previous boot's cut.
		if boot > 0 {
			res.Cuts++
		}
		var failed []string
		for _, p := range out.problems {
			failed = append(failed, "boot: "+p)
		}
		for _, f := range res.PerFS {
			for _, v := range f.takeBoot(models[f.FS], out, boot > 0) {
				failed = append(failed, f.FS+": "+v)
			}
		}
		failed = append(failed, out.fails...)
		what := fmt.Sprintf("boot %d/%d", boot, c.Count)
		if boot > 0 {
			what += fmt.Sprintf(" (checks cut %d, seed %d)", boot-1, seed-1)
		}
		for _, s := range failed {
			res.Failures = append(res.Failures, what+": "+s)
		}
		c.progress("%s: %s", what, out.summary(c.Filesystems, failed))
		if len(failed) > 0 && !c.KeepGoing {
			break
		}
	}
	res.Seconds = time.Since(start).Seconds()
	if res.OK() {
		removeDisks(disks)
	}
	return res, nil
}

func (c *CutsConfig) validate() error {
	if c.Count < 1 {
		return fmt.Errorf("cuts: count %d: want at least one", c.Count)
	}
	if c.MaxDelay <= 0 {
		return fmt.Errorf("cuts: max delay %s: want a positive duration", c.MaxDelay)
	}
	for _, fs := range c.Filesystems {
		if _, ok := fsckCommand(fs, ""); !ok {
			return fmt.Errorf("cuts: no checker for %s (have ext4, xfs, btrfs)", fs)
		}
	}
	return nil
}

// takeBoot judges what one boot found on f's filesystem against the model
// (a cut, when cut is set), then adds the boot's acknowledgements to the
// model for the next check. It returns the violations.
func (f *CutsFS) takeBoot(m *cutModel, out *bootOutcome, cut bool) []string {
	var v []string
	if cut {
		f.Cuts++
	}
	if rep, ok := out.reports[f.FS]; ok {
		v = m.judge(rep)
		m.adopt(rep)
		f.Layers += len(rep.Layers)
		f.MountMillis = append(f.MountMillis, rep.MountMillis)
	} else {
		v = append(v, "the guest sent no report")
	}
	if msg, ok := out.fsck[f.FS]; ok {
		f.Fsck++
		if msg != "" {
			v = append(v, msg)
		}
	}
	// Then this boot's acks, for the next check.
	for _, a := range out.acks[f.FS] {
		if err := m.ack(a); err != nil {
			v = append(v, "protocol: "+err.Error())
		}
	}
	f.Acked += len(out.acks[f.FS])
	if op := out.lastOp[f.FS]; op != "" {
		if a, err := decodeAck(op); err != nil {
			v = append(v, "protocol: "+err.Error())
		} else {
			m.underWay = &a
		}
	}
	if len(v) > 0 && cut {
		f.Failed++
	}
	return v
}

func (o *bootOutcome) summary(fss []string, failed []string) string {
	var parts []string
	for _, fs := range fss {
		p := fs + ":"
		if r, ok := o.reports[fs]; ok {
			p += fmt.Sprintf(" %d layers, mount %dms", len(r.Layers), r.MountMillis)
		}
		if msg, ok := o.fsck[fs]; ok && msg == "" {
			p += ", fsck clean"
		}
		if o.killed {
			p += fmt.Sprintf(", %d acked", len(o.acks[fs]))
			if op := o.lastOp[fs]; op != "" {
				p += " (under way: " + op + ")"
			}
		}
		parts = append(parts, p)
	}
	s := strings.Join(parts, "; ")
	if o.killed {
		s += fmt.Sprintf("; killed %.1fs after the workloads began", o.delay.Seconds())
	}
	s += fmt.Sprintf("; %.1fs", o.seconds)
	if len(failed) > 0 {
		s += fmt.Sprintf("; %d FAILURES:\n    %s", len(failed), strings.Join(failed, "\n    "))
	}
	return s
}

// boot runs one guest: check, then (run) a workload cut off at a moment
// the seed picks.
func (c *CutsConfig) boot(ctx context.Context, n int, seed uint64, run bool, initrd string, disks map[string]string) (*bootOutcome, error) {
	out := &bootOutcome{reports: map[string]guestproto.CutReport{}, acks: map[string][]guestproto.CutAck{},
		lastOp: map[string]string{}, fsck: map[string]string{}}
	sock := filepath.Join(c.WorkDir, "cuts.sock")
	os.Remove(sock)
	resultsPath := resultsFile(c.WorkDir, fmt.Sprintf("results-%d.txt", n))
	qargs := c.qemuArgs(disks, resultsPath,
		// wait=on: the guest does not start before the host listens.
		"-chardev", "socket,id=cuts,path="+sock+",server=on,wait=on",
		"-device", "virtserialport,chardev=cuts,name="+guestproto.CutPort,
	)
	serialPath := filepath.Join(c.WorkDir, fmt.Sprintf("serial-%d.log", n))
	m, err := c.startMachine(ctx, initrd, serialPath, qargs, nil)
	if err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		out.seconds, waitErr = m.wait()
		close(exited)
	}()
	conn, err := dialPort(sock, exited)
	if err != nil {
		out.problems = append(out.problems, err.Error())
	} else {
		c.converse(conn, m.vm, seed, n, run, disks, out)
		conn.Close()
	}
	<-exited
	console := m.console()
	if !out.killed && waitErr != nil {
		out.problems = append(out.problems, fmt.Sprintf("qemu: %v; last console lines:\n%s", waitErr, verdict.Tail(console, 25)))
	}
	for _, s := range verdict.FindSplats(console) {
		out.problems = append(out.problems, fmt.Sprintf("kernel %s report:\n%s", s.Kind, strings.Join(s.Excerpt, "\n")))
	}
	if !run {
		// The last boot ends normally: its test binary must pass.
		out.problems = append(out.problems, c.finalResults(resultsPath)...)
	}
	return out, nil
}

// dialPort connects to QEMU's end of the protocol port, which appears
// once QEMU listens.
func dialPort(sock string, exited <-chan struct{}) (net.Conn, error) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := net.Dial("unix", sock)
		if err == nil {
			return conn, nil
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("qemu exited before its protocol port listened: %w", err)
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("connect to the protocol port: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// converse runs the host's side of one boot's protocol until the guest
// is gone: the start record, the reports, the filesystem checks while the
// guest waits, and the kill.
func (c *CutsConfig) converse(conn net.Conn, m *qemu.VM, seed uint64, n int, run bool, disks map[string]string, out *bootOutcome) {
	rng := rand.New(rand.NewPCG(seed, 0xc075))
	cs := &cutSession{c: c, conn: conn, vm: m, seed: seed, boot: n, run: run, disks: disks, out: out,
		delay: time.Duration(rng.Int64N(int64(c.MaxDelay))), began: map[string]bool{}, state: "hello"}
	defer func() {
		if cs.killTimer != nil {
			cs.killTimer.Stop()
		}
	}()
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		cs.mu.Lock()
		cs.handle(sc.Text())
		cs.mu.Unlock()
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.state == "hello" {
		out.problems = append(out.problems, "the guest never finished its check (see the serial log)")
	}
	if cs.state == "run" && !out.killed {
		out.problems = append(out.problems, "the guest ended before the cut")
	}
}

// A cutSession is the host's side of one boot's conversation.
type cutSession struct {
	c     *CutsConfig
	conn  net.Conn
	vm    *qemu.VM
	seed  uint64
	boot  int
	run   bool // run the workload after the check
	disks map[string]string
	delay time.Duration // of the cut, once every filesystem began
	// mu guards out, state and the timer, which the kill timer and the
	// reading loop share.
	mu        sync.Mutex
	out       *bootOutcome
	state     string // hello, run or stop
	began     map[string]bool
	killTimer *time.Timer
}

// send writes one record to the guest; mu is held.
func (cs *cutSession) send(verb string, v any) {
	b, _ := json.Marshal(v)
	if _, err := fmt.Fprintf(cs.conn, "%s %s\n", verb, b); err != nil {
		cs.out.fails = append(cs.out.fails, fmt.Sprintf("send %s: %v", verb, err))
	}
}

// handle takes one record from the guest; mu is held.
func (cs *cutSession) handle(line string) {
	out := cs.out
	verb, fs, payload := parseCutLine(line)
	switch verb {
	case "hello":
		cs.send("start", guestproto.CutStart{Boot: cs.boot, Seed: cs.seed, Run: cs.run})
	case "report":
		var r guestproto.CutReport
		if err := json.Unmarshal([]byte(payload), &r); err != nil {
			out.fails = append(out.fails, fmt.Sprintf("report of %s: %v", fs, err))
		} else {
			out.reports[fs] = r
		}
	case "clean":
		cs.clean()
	case "begin":
		cs.began[fs] = true
		if len(cs.began) == len(cs.c.Filesystems) && cs.killTimer == nil && cs.state == "run" {
			out.delay = cs.delay
			cs.killTimer = time.AfterFunc(cs.delay, func() {
				cs.mu.Lock()
				out.killed = true
				cs.mu.Unlock()
				cs.vm.Kill()
			})
		}
	case "op":
		out.lastOp[fs] = payload
	case "ack":
		a, err := decodeAck(payload)
		if err != nil {
			out.fails = append(out.fails, fs+": "+err.Error())
		} else {
			out.acks[fs] = append(out.acks[fs], a)
			out.lastOp[fs] = ""
		}
	case "fail":
		out.fails = append(out.fails, fs+": guest: "+payload)
	default:
		out.fails = append(out.fails, fmt.Sprintf("unknown record %q", line))
	}
}

// clean: every disk is unmounted in the guest, so the host checks them
// now, then tells the guest to run its workload or to stop.
func (cs *cutSession) clean() {
	for _, f := range cs.c.Filesystems {
		cs.out.fsck[f] = fsck(f, cs.disks[f])
	}
	if cs.run {
		fmt.Fprintln(cs.conn, "go")
		cs.state = "run"
	} else {
		fmt.Fprintln(cs.conn, "stop")
		cs.state = "stop"
	}
}

// finalResults reads the results stream of a boot that ended by itself
// and returns its problems: the test binary must have ended and passed.
func (c *CutsConfig) finalResults(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return []string{"guest sent no results"}
	}
	defer f.Close()
	g, err := guestproto.Parse(f)
	if err != nil {
		return []string{err.Error()}
	}
	var probs []string
	for _, b := range g.Binaries {
		if !b.Ended || b.ExitCode != 0 {
			probs = append(probs, fmt.Sprintf("%s exited %d:\n%s", b.Pkg, b.ExitCode,
				verdict.Tail(strings.Split(string(b.Output), "\n"), 30)))
		}
	}
	if !g.Done {
		probs = append(probs, "guest did not complete its run")
	}
	return probs
}

// fsckCommand is the read-only check of fs's image.
func fsckCommand(fs, img string) ([]string, bool) {
	switch fs {
	case "ext4":
		return []string{"e2fsck", "-f", "-n", img}, true
	case "xfs":
		return []string{"xfs_repair", "-n", img}, true
	case "btrfs":
		return []string{"btrfs", "check", "--readonly", img}, true
	}
	return nil, false
}

// fsck checks an image the guest has unmounted; "" means clean.
func fsck(fs, img string) string {
	argv, _ := fsckCommand(fs, img)
	cmd := exec.Command(argv[0], argv[1:]...)
	b, err := cmd.CombinedOutput()
	if err == nil {
		return ""
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return fmt.Sprintf("%s exited %d:\n%s", strings.Join(argv[:len(argv)-1], " "), ee.ExitCode(),
			verdict.Tail(strings.Split(strings.TrimSpace(string(b)), "\n"), 20))
	}
	return fmt.Sprintf("%s: %v", argv[0], err)
}

// WriteCutsTable prints one row per filesystem.
func WriteCutsTable(w io.Writer, r *CutsResult) {
	fmt.Fprintf(w, "%-6s %5s %8s %6s %7s %5s %12s\n", "fs", "cuts", "failures", "acked", "layers", "fsck", "mount ms p50")
	for _, f := range r.PerFS {
		ms := append([]int64(nil), f.MountMillis...)
		sort.Slice(ms, func(i, j int) bool { return ms[i] < ms[j] })
		med := int64(0)
		if len(ms) > 0 {
			med = ms[len(ms)/2]
		}
		fmt.Fprintf(w, "%-6s %5d %8d %6d %7d %5d %12d\n", f.FS, f.Cuts, f.Failed, f.Acked, f.Layers, f.Fsck, med)
	}
	secs := append([]float64(nil), r.BootSecs...)
	sort.Float64s(secs)
	med := 0.0
	if len(secs) > 0 {
		med = secs[len(secs)/2]
	}
	fmt.Fprintf(w, "seeds %d..%d, %d boots, %.0fs in all, %.1fs per boot (median)\n",
		r.Seed, r.Seed+uint64(max(r.Cuts, 1))-1, len(r.BootSecs), r.Seconds, med)
}
