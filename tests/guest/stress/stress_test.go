//go:build ovlkit_guest

// Package stress runs the layer store under load in the guest: 64
// goroutines of this process and 16 of a second one (this test binary
// run again) on one store, each creating, applying, mounting, reading,
// writing, diffing and removing layers of its own on shared base layers
// that every goroutine also mounts, while a child in a mount namespace of
// its own holds a copy of a layer's mount as the layer is put and
// removed. At the end no operation failed (none with EBUSY above all),
// nothing of the store is mounted, the process has the file descriptors
// and goroutines it had before, and Check is clean. It logs operations
// per second and the peak RSS of both processes ("stress-row:").
//
// OVLKIT_STRESS_OPS (default 1000, the short run of make test) is the
// operations of this process; the second process does a quarter as
// many. OVLKIT_STRESS_FS (default ext4) lists the filesystems. make
// stress runs 10,000 on ext4 and xfs.
package stress

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/ovl"
	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

const (
	envOps  = "OVLKIT_STRESS_OPS"
	envFS   = "OVLKIT_STRESS_FS"
	envRole = "OVLKIT_STRESS_ROLE" // of a re-executed test binary: peer or holdns
	envHome = "OVLKIT_STRESS_HOME"
	envSeed = "OVLKIT_STRESS_SEED"

	goroutines     = 64
	peerGoroutines = 16
	nsRounds       = 3
	// opsPerCycle is what worker.cycle counts: create, apply, get and
	// put of the layer and of a base, diff, create, get, put, diff and
	// remove of a container layer, the refused remove of the base, and
	// the remove of the layer. run.start checks it.
	opsPerCycle = 14
	rowMarker   = "stress-row: "
)

// bases are the shared image layers every goroutine builds on and
// mounts; each has a container layer on it for the whole run, so that
// removing one must fail with ErrHasChildren.
var bases = []string{"base0", "base1", "base2"}

func TestMain(m *testing.M) {
	switch os.Getenv(envRole) {
	case "peer":
		os.Exit(peerMain())
	case "holdns":
		os.Exit(holdMain())
	}
	os.Exit(m.Run())
}

// stats is what one process's workers did.
type stats struct {
	Ops     int64    `json:"ops"`
	Errors  []string `json:"errors,omitempty"`
	EBUSY   int      `json:"ebusy"`
	Seconds float64  `json:"seconds"`
	MaxRSS  int64    `json:"maxrss_kb"`
}

// run is one process's share of the load: g goroutines until ops
// operations were started.
type run struct {
	s      *graph.Store
	prefix string
	target int64
	seed   uint64
	done   atomic.Int64
	// reserved counts the operations of the cycles started.
	reserved atomic.Int64
	cycles   atomic.Int64
	mu       sync.Mutex
	st       stats
}

func (r *run) fail(what string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if errors.Is(err, unix.EBUSY) {
		r.st.EBUSY++
	}
	if len(r.st.Errors) < 20 {
		r.st.Errors = append(r.st.Errors, fmt.Sprintf("%s: %v", what, err))
	} else if len(r.st.Errors) == 20 {
		r.st.Errors = append(r.st.Errors, "(more errors left out)")
	}
}

func (r *run) start(g int) {
	t0 := time.Now()
	var wg sync.WaitGroup
	for i := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := worker{r: r, g: i, rng: rand.New(rand.NewPCG(r.seed, uint64(i)))}
			// A cycle starts only when its operations fit the target,
			// so that the run does the operations asked for, give or
			// take one cycle's.
			for r.reserved.Add(opsPerCycle)-opsPerCycle < r.target {
				if err := w.cycle(context.Background()); err != nil {
					r.fail(fmt.Sprintf("%s goroutine %d", r.prefix, i), err)
					return
				}
				r.cycles.Add(1)
			}
		}()
	}
	wg.Wait()
	r.st.Ops = r.done.Load()
	if n := r.cycles.Load(); len(r.st.Errors) == 0 && r.st.Ops != n*opsPerCycle {
		r.fail("count", fmt.Errorf("%d operations in %d cycles, want %d each", r.st.Ops, n, opsPerCycle))
	}
	r.st.Seconds = time.Since(t0).Seconds()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err == nil {
		r.st.MaxRSS = ru.Maxrss
	}
}

type worker struct {
	r   *run
	g   int
	n   int
	rng *rand.Rand
}

// op counts one operation and wraps its error with what it was.
func (w *worker) op(what string, err error) error {
	w.r.done.Add(1)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// cycle is one layer's life: create, apply, mount and read, mount a
// shared base beside everyone else, diff, a container layer on it
// written through its mount, diffed and removed, a refused removal of a
// base, and the removal of the layer.
func (w *worker) cycle(ctx context.Context) error {
	s := w.r.s
	w.n++
	id := fmt.Sprintf("%s-g%d-%d", w.r.prefix, w.g, w.n)
	base := bases[w.rng.IntN(len(bases))]
	if err := w.op("create "+id, s.Create(ctx, id, base)); err != nil {
		return err
	}
	c := content(id)
	if _, err := s.ApplyDiff(ctx, id, bytes.NewReader(c.tar)); w.op("apply "+id, err) != nil {
		return fmt.Errorf("apply %s: %w", id, err)
	}
	if err := w.readThrough(ctx, id, c); err != nil {
		return err
	}
	if err := w.readThrough(ctx, base, content(base)); err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := w.op("diff "+id, s.Diff(ctx, id, &buf)); err != nil {
		return err
	}
	if files, err := guestfs.TarFiles(&buf); err != nil {
		return fmt.Errorf("diff %s: %w", id, err)
	} else if d := guestfs.DiffFiles(files, c.files); d != "" {
		return fmt.Errorf("diff %s: %s", id, d)
	}
	rw := id + "-rw"
	if err := w.op("create rw "+rw, s.CreateReadWrite(ctx, rw, id)); err != nil {
		return err
	}
	root, err := s.Get(ctx, rw)
	if err := w.op("get "+rw, err); err != nil {
		return err
	}
	data := []byte(strings.Repeat(rw, 1+w.rng.IntN(200)))
	werr := os.WriteFile(filepath.Join(root, "d", "written"), data, 0o644)
	if err := w.op("put "+rw, s.Put(ctx, rw)); err != nil {
		return err
	}
	if werr != nil {
		return fmt.Errorf("write through %s: %w", rw, werr)
	}
	buf.Reset()
	if err := w.op("diff "+rw, s.Diff(ctx, rw, &buf)); err != nil {
		return err
	}
	files, err := guestfs.TarFiles(&buf)
	if err != nil {
		return fmt.Errorf("diff %s: %w", rw, err)
	}
	if sum := sha256.Sum256(data); files["/d/written"] != hex.EncodeToString(sum[:]) {
		return fmt.Errorf("diff %s does not hold what was written: %v", rw, files)
	}
	if err := w.op("remove "+rw, s.Remove(ctx, rw)); err != nil {
		return err
	}
	// Refused: the base has children, and another goroutine may have
	// it mounted, which Remove finds first.
	err = s.Remove(ctx, base)
	w.r.done.Add(1)
	if !errors.Is(err, graph.ErrHasChildren) && !errors.Is(err, graph.ErrMounted) {
		return fmt.Errorf("remove of base %s with children: %v, want ErrHasChildren or ErrMounted", base, err)
	}
	return w.op("remove "+id, s.Remove(ctx, id))
}

// readThrough mounts id, reads its d/f0 back and puts it.
func (w *worker) readThrough(ctx context.Context, id string, c layerContent) error {
	s := w.r.s
	root, err := s.Get(ctx, id)
	if err := w.op("get "+id, err); err != nil {
		return err
	}
	b, rerr := os.ReadFile(filepath.Join(root, "d", "f0"))
	if err := w.op("put "+id, s.Put(ctx, id)); err != nil {
		return err
	}
	if rerr != nil {
		return fmt.Errorf("read %s/d/f0: %w", id, rerr)
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != c.files["/d/f0"] {
		return fmt.Errorf("%s/d/f0 reads back wrong through the mount", id)
	}
	return nil
}

// layerContent is a small layer made from its ID alone.
type layerContent struct {
	tar   []byte
	files map[string]string
}

func content(id string) layerContent {
	h := fnv.New64a()
	h.Write([]byte(id))
	rng := rand.New(rand.NewPCG(h.Sum64(), 1))
	c := layerContent{files: map[string]string{}}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755})
	for i := range 3 {
		b := make([]byte, 1+rng.IntN(8192))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		name := fmt.Sprintf("d/f%d", i)
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b))})
		tw.Write(b)
		sum := sha256.Sum256(b)
		c.files["/"+name] = hex.EncodeToString(sum[:])
	}
	tw.Close()
	c.tar = buf.Bytes()
	return c
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

func TestStress(t *testing.T) {
	guesttest.Keeps(t, "the layer store under 64 goroutines, a second process and a mount namespace: no EBUSY, no leak")
	ops := envInt(t, envOps, 1000)
	want := map[string]bool{}
	for _, f := range strings.Split(os.Getenv(envFS), ",") {
		if f = strings.TrimSpace(f); f != "" {
			want[f] = true
		}
	}
	if len(want) == 0 {
		want["ext4"] = true
	}
	var u unix.Utsname
	unix.Uname(&u)
	t.Logf("%skernel | fs | ops (this process + peer) | goroutines | namespace rounds | seconds | ops/s | peak RSS MiB (this process, peer)", rowMarker)
	ran := 0
	for _, fs := range guesttest.Filesystems() {
		if !want[fs.Name] {
			continue
		}
		ran++
		t.Run(fs.Name, func(t *testing.T) {
			stress(t, fs, ops, unix.ByteSliceToString(u.Release[:]))
		})
	}
	if ran != len(want) {
		t.Errorf("%s=%s names filesystems the guest does not have", envFS, os.Getenv(envFS))
	}
}

func stress(t *testing.T, fs guesttest.FS, ops int, release string) {
	home := filepath.Join(fs.Scratch(t, ""), "store")
	// The runtime's poller keeps two descriptors from its first use on
	// (the pipes of the second process would be that): start it before
	// counting.
	if r, w, err := os.Pipe(); err == nil {
		r.Close()
		w.Close()
	}
	fds0 := openFDs(t)
	g0 := runtime.NumGoroutine()
	feat, err := ovl.Probe(fs.Scratch(t, ""))
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	s, err := graph.Open(home, graph.Options{Create: true, Features: &feat})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	ctx := context.Background()
	for _, b := range bases {
		if err := s.Create(ctx, b, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ApplyDiff(ctx, b, bytes.NewReader(content(b).tar)); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateReadWrite(ctx, "pin-"+b, b); err != nil {
			t.Fatal(err)
		}
	}

	t0 := time.Now()
	peer := startPeer(t, home, ops/4)
	self := &run{s: s, prefix: "main", target: int64(ops), seed: 1}
	var nsErrs []string
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range nsRounds {
			if err := namespaceRound(ctx, s, fmt.Sprintf("ns-%d", i)); err != nil {
				nsErrs = append(nsErrs, err.Error())
				if errors.Is(err, unix.EBUSY) {
					self.mu.Lock()
					self.st.EBUSY++
					self.mu.Unlock()
				}
			}
		}
	}()
	self.start(goroutines)
	wg.Wait()
	ps, err := peer.wait()
	if err != nil {
		t.Errorf("second process: %v", err)
	}
	secs := time.Since(t0).Seconds()

	for _, e := range append(self.st.Errors, ps.Errors...) {
		t.Errorf("operation failed: %s", e)
	}
	for _, e := range nsErrs {
		t.Errorf("mount namespace round: %s", e)
	}
	if n := self.st.EBUSY + ps.EBUSY; n > 0 {
		t.Errorf("%d operations failed with EBUSY", n)
	}
	if self.st.Ops < int64(ops) {
		t.Errorf("this process did %d operations, want at least %d", self.st.Ops, ops)
	}
	if left := storeMounts(t, home); len(left) > 0 {
		t.Errorf("mounts left under the store: %v", left)
	}
	probs, err := s.Check()
	if err != nil {
		t.Errorf("check: %v", err)
	}
	if len(probs) > 0 {
		t.Errorf("check: %s", graph.Summary(probs))
	}
	if ls, err := s.Layers(); err != nil || len(ls) != 2*len(bases) {
		t.Errorf("layers at the end: %d (%v), want the %d bases and their pins", len(ls), err, 2*len(bases))
	}
	if err := s.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if extra := diffFDs(fds0, openFDs(t)); len(extra) > 0 {
		t.Errorf("file descriptors left open: %v", extra)
	}
	if n := settleGoroutines(g0); n > g0 {
		t.Errorf("%d goroutines after the run, %d before", n, g0)
	}
	total := self.st.Ops + ps.Ops + nsRounds
	t.Logf("%s%s | %s | %d (%d + %d) | %d + %d | %d | %.1f | %.1f | %.1f, %.1f", rowMarker, release, fs.Name,
		total, self.st.Ops, ps.Ops, goroutines, peerGoroutines, nsRounds, secs, float64(total)/secs,
		float64(self.st.MaxRSS)/1024, float64(ps.MaxRSS)/1024)
}

// namespaceRound mounts a layer, lets a child in a new mount namespace
// (a copy of ours, so holding a copy of the mount) make its working
// directory inside it, and puts and removes the layer while the child
// holds it: neither may fail with EBUSY, and the child's copy of the
// mount must be gone afterwards.
func namespaceRound(ctx context.Context, s *graph.Store, id string) error {
	if err := s.Create(ctx, id, bases[0]); err != nil {
		return err
	}
	if _, err := s.ApplyDiff(ctx, id, bytes.NewReader(content(id).tar)); err != nil {
		return err
	}
	merged, err := s.Get(ctx, id)
	if err != nil {
		return err
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"=holdns")
	cmd.Dir = merged
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start namespace holder: %w", err)
	}
	defer func() {
		stdin.Close()
		cmd.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		return fmt.Errorf("namespace holder: %q, %v", line, err)
	}
	info := fmt.Sprintf("/proc/%d/mountinfo", cmd.Process.Pid)
	if !mountedIn(info, merged) {
		return fmt.Errorf("the child's namespace has no copy of %s", merged)
	}
	if err := s.Put(ctx, id); err != nil {
		return fmt.Errorf("put %s while another namespace holds it: %w", id, err)
	}
	if err := s.Remove(ctx, id); err != nil {
		return fmt.Errorf("remove %s while another namespace held it: %w", id, err)
	}
	if mountedIn(info, merged) {
		return fmt.Errorf("the child's copy of %s outlived the layer's removal", merged)
	}
	return nil
}

func mountedIn(mountinfo, mp string) bool {
	b, err := os.ReadFile(mountinfo)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && ovl.UnescapeMountField(f[4]) == mp {
			return true
		}
	}
	return false
}

// holdMain is the namespace holder: its working directory is in the
// mount; it says so and waits until its stdin closes.
func holdMain() int {
	if _, err := os.ReadDir("."); err != nil {
		fmt.Fprintln(os.Stderr, "holdns:", err)
		return 1
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

type peerProc struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

func startPeer(t *testing.T, home string, ops int) *peerProc {
	p := &peerProc{cmd: exec.Command(os.Args[0], "-test.run=^$")}
	p.cmd.Env = append(os.Environ(), envRole+"=peer", envHome+"="+home, envOps+"="+strconv.Itoa(max(ops, 1)), envSeed+"=2")
	p.cmd.Stdout = &p.out
	p.cmd.Stderr = os.Stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start the second process: %v", err)
	}
	return p
}

func (p *peerProc) wait() (stats, error) {
	var st stats
	if err := p.cmd.Wait(); err != nil {
		return st, fmt.Errorf("%w; output: %s", err, p.out.String())
	}
	if err := json.Unmarshal(p.out.Bytes(), &st); err != nil {
		return st, fmt.Errorf("its report %q: %w", p.out.String(), err)
	}
	return st, nil
}

// peerMain is the second process: its own Store on the same home.
func peerMain() int {
	ops, _ := strconv.Atoi(os.Getenv(envOps))
	seed, _ := strconv.ParseUint(os.Getenv(envSeed), 10, 64)
	s, err := graph.Open(os.Getenv(envHome), graph.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer: open:", err)
		return 1
	}
	r := &run{s: s, prefix: "peer", target: int64(ops), seed: seed}
	r.start(peerGoroutines)
	if err := s.Close(); err != nil {
		r.fail("close", err)
	}
	json.NewEncoder(os.Stdout).Encode(r.st)
	return 0
}

func openFDs(t *testing.T) map[string]string {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		target, _ := os.Readlink("/proc/self/fd/" + e.Name())
		out[e.Name()] = target
	}
	return out
}

// diffFDs lists descriptors of after that before did not have; the one
// that read the directory is closed again by then.
func diffFDs(before, after map[string]string) []string {
	var out []string
	for fd, target := range after {
		if before[fd] != target && !strings.HasPrefix(target, "/proc/") {
			out = append(out, fd+" -> "+target)
		}
	}
	sort.Strings(out)
	return out
}

// settleGoroutines waits up to five seconds for the goroutine count to
// come down to n and returns it.
func settleGoroutines(n int) int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		g := runtime.NumGoroutine()
		if g <= n || time.Now().After(deadline) {
			return g
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// storeMounts lists the mounts under home.
func storeMounts(t *testing.T, home string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			if mp := ovl.UnescapeMountField(f[4]); strings.HasPrefix(mp, home+"/") {
				out = append(out, mp)
			}
		}
	}
	return out
}
