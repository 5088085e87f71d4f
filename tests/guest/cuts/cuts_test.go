//go:build ovlkit_guest

// Package cuts is the guest side of the hard-cut loop ("ovlvm cuts",
// vm/cuts.go): every boot mounts the persistent ext4 and xfs disks, which
// replays their journals, opens the layer store on each (its recovery
// runs), reports what the store holds, unmounts the disks for the host to
// check them, and then runs a store workload on both until the host kills
// the VM. Each operation is acknowledged to the host after it returned;
// the host judges the next boot's report against what it received.
//
// The protocol runs over a virtio-serial port of its own (guestproto.CutPort),
// one line per record: the guest sends hello, report FS JSON, clean,
// begin FS, op FS JSON, ack FS JSON and fail FS TEXT; the host answers
// hello with start JSON and clean with go or stop.
//
// It is a module of its own so that the default package pattern
// (./tests/guest/...) does not reach it: it needs the host's side of the
// port, and only "ovlvm cuts" (make crash) gives it one.
package cuts

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
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/ovl"
	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
	"github.com/ovlkit/ovlkit/vm/guestproto"
)

// maxLayers bounds each store, so that a check reads a bounded amount.
const maxLayers = 12

// port is the guest's end of the protocol.
type port struct {
	mu sync.Mutex
	f  *os.File
	r  *bufio.Reader
}

func openPort(t *testing.T) *port {
	t.Helper()
	names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil || strings.TrimSpace(string(b)) != guestproto.CutPort {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(n))
		f, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err != nil {
			t.Fatalf("open the protocol port %s: %v", dev, err)
		}
		return &port{f: f, r: bufio.NewReader(f)}
	}
	t.Fatalf("no virtio port named %s: this test runs under ovlvm cuts only", guestproto.CutPort)
	return nil
}

// send writes one record in one write.
func (p *port) send(verb, fs string, payload any) error {
	line := verb
	if fs != "" {
		line += " " + fs
	}
	switch v := payload.(type) {
	case nil:
	case string:
		line += " " + strings.ReplaceAll(v, "\n", " | ")
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		line += " " + string(b)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := p.f.WriteString(line + "\n")
	return err
}

func (p *port) read() (string, error) {
	line, err := p.r.ReadString('\n')
	return strings.TrimSpace(line), err
}

// disk is one persistent disk of the run.
type disk struct {
	name, dev, dir string
}

func (d disk) home() string { return filepath.Join(d.dir, "store") }

func disks(t *testing.T) []disk {
	var out []disk
	for _, fs := range guesttest.Filesystems() {
		if fs.Device == "" {
			continue
		}
		out = append(out, disk{name: fs.Name, dev: fs.Device, dir: filepath.Join("/mnt/cuts", fs.Name)})
	}
	if len(out) == 0 {
		t.Fatal("no disks attached")
	}
	return out
}

func (d disk) mount() (time.Duration, error) {
	if err := os.MkdirAll(d.dir, 0o755); err != nil {
		return 0, err
	}
	t0 := time.Now()
	if err := unix.Mount(d.dev, d.dir, d.name, 0, ""); err != nil {
		return 0, fmt.Errorf("mount %s (%s) on %s: %w", d.dev, d.name, d.dir, err)
	}
	return time.Since(t0), nil
}

func (d disk) unmount() error {
	if err := unix.Unmount(d.dir, 0); err != nil {
		return fmt.Errorf("unmount %s: %w", d.dir, err)
	}
	return nil
}

func TestCuts(t *testing.T) {
	p := openPort(t)
	defer p.f.Close()
	if err := p.send("hello", "", nil); err != nil {
		t.Fatalf("send hello: %v", err)
	}
	line, err := p.read()
	if err != nil {
		t.Fatalf("read start: %v", err)
	}
	var st guestproto.CutStart
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "start ")), &st); err != nil {
		t.Fatalf("start record %q: %v", line, err)
	}
	t.Logf("boot %d, seed %d, workload %v", st.Boot, st.Seed, st.Run)
	ds := disks(t)
	for _, d := range ds {
		rep := check(d)
		if err := p.send("report", d.name, rep); err != nil {
			t.Fatalf("send report: %v", err)
		}
		if err := d.unmount(); err != nil && rep.OpenError == "" {
			t.Fatal(err)
		}
	}
	if err := p.send("clean", "", nil); err != nil {
		t.Fatalf("send clean: %v", err)
	}
	if line, err = p.read(); err != nil {
		t.Fatalf("read go: %v", err)
	}
	if line == "stop" {
		return
	}
	if line != "go" {
		t.Fatalf("host said %q, want go or stop", line)
	}
	// The workloads run until the host kills the VM; one returns only
	// when an operation failed, which it reported.
	var wg sync.WaitGroup
	for i, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &workload{p: p, d: d, boot: st.Boot, rng: rand.New(rand.NewPCG(st.Seed, uint64(i)))}
			if err := w.run(); err != nil {
				p.send("fail", d.name, err.Error())
				t.Errorf("%s: %v", d.name, err)
			}
		}()
	}
	wg.Wait()
}

// check mounts d, opens its store and reports what it holds.
func check(d disk) guestproto.CutReport {
	rep := guestproto.CutReport{FS: d.name}
	took, err := d.mount()
	if err != nil {
		rep.OpenError = err.Error()
		return rep
	}
	rep.MountMillis = took.Milliseconds()
	if _, err := os.Stat(d.home()); errors.Is(err, os.ErrNotExist) {
		return rep
	}
	s, err := graph.Open(d.home(), graph.Options{})
	if errors.Is(err, graph.ErrNoStore) {
		// A store whose creation was cut off: absent.
		return rep
	}
	if err != nil {
		rep.OpenError = err.Error()
		return rep
	}
	rep.Store = true
	defer s.Close()
	probs, err := s.Check()
	if err != nil {
		rep.Errors = append(rep.Errors, fmt.Sprintf("check: %v", err))
	}
	for _, pr := range probs {
		rep.Problems = append(rep.Problems, pr.String())
	}
	if ents, err := os.ReadDir(filepath.Join(d.home(), "staging")); err != nil {
		rep.Errors = append(rep.Errors, fmt.Sprintf("read staging: %v", err))
	} else {
		for _, e := range ents {
			rep.Staging = append(rep.Staging, e.Name())
		}
	}
	ctx := context.Background()
	reps, err := s.VerifyAll(ctx)
	if err != nil {
		rep.Errors = append(rep.Errors, fmt.Sprintf("verify: %v", err))
	}
	states := map[string]graph.Report{}
	for _, r := range reps {
		states[r.Layer] = r
	}
	infos, err := s.Layers()
	if err != nil {
		rep.Errors = append(rep.Errors, fmt.Sprintf("layers: %v", err))
	}
	for _, li := range infos {
		l := guestproto.CutLayer{ID: li.ID, Parent: li.Parent, RW: li.RW, State: string(states[li.ID].State)}
		for _, dmg := range states[li.ID].Damage {
			l.Damage = append(l.Damage, dmg.String())
		}
		switch states[li.ID].State {
		case graph.StateOK, graph.StateEmpty, graph.StateChanged:
			var buf bytes.Buffer
			if err := s.Diff(ctx, li.ID, &buf); err != nil {
				rep.Errors = append(rep.Errors, fmt.Sprintf("diff %s: %v", li.ID, err))
				break
			}
			files, err := guestfs.TarFiles(&buf)
			if err != nil {
				rep.Errors = append(rep.Errors, fmt.Sprintf("diff %s: %v", li.ID, err))
				break
			}
			l.Files = files
			if !li.RW && states[li.ID].State == graph.StateOK {
				if d := guestfs.DiffFiles(files, content(li.ID).files); d != "" {
					l.Bad = append(l.Bad, "content is not the workload's: "+d)
				}
			}
		}
		rep.Layers = append(rep.Layers, l)
	}
	if err := s.Cleanup(); err != nil {
		rep.Errors = append(rep.Errors, fmt.Sprintf("cleanup: %v", err))
	}
	rep.Mounts = mountsBelow(d.dir)
	return rep
}

// mountsBelow lists the mount points under dir.
func mountsBelow(dir string) []string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 {
			if mp := ovl.UnescapeMountField(f[1]); strings.HasPrefix(mp, dir+"/") {
				out = append(out, mp)
			}
		}
	}
	return out
}

// layerContent is what the workload applies to an image layer: made from
// its ID alone, so a check can tell it from anything else.
type layerContent struct {
	tar   []byte
	files map[string]string
}

func content(id string) layerContent {
	h := fnv.New64a()
	h.Write([]byte(id))
	rng := rand.New(rand.NewPCG(h.Sum64(), 7))
	c := layerContent{files: map[string]string{}}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string) {
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755})
	}
	file := func(name string, size int, mode int64) {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode, Size: int64(size)})
		tw.Write(b)
		sum := sha256.Sum256(b)
		c.files["/"+name] = hex.EncodeToString(sum[:])
	}
	dir("d/")
	dir("d/s/")
	file("d/big", 32<<10+rng.IntN(768<<10), 0o755)
	file("d/empty", 0, 0o644)
	for i := range 8 {
		file(fmt.Sprintf("d/s/f%d", i), rng.IntN(4096), 0o644)
	}
	tw.WriteHeader(&tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "d/big", Mode: 0o777})
	c.files["/link"] = "-> d/big"
	tw.Close()
	c.tar = buf.Bytes()
	return c
}

// workload runs store operations on one disk until the VM dies.
type workload struct {
	p    *port
	d    disk
	boot int
	rng  *rand.Rand
	s    *graph.Store
	n    int
	// layers is the store as this workload knows it.
	layers map[string]*known
	held   map[string]bool // image layers got and not yet put
}

type known struct {
	parent  string
	rw      bool
	applied bool
	// committed: it has had a child, so Get mounts it read-only (a
	// leaf image layer is mounted writable, and a write would make
	// its content the container's).
	committed bool
}

func (w *workload) run() error {
	if _, err := w.d.mount(); err != nil {
		return err
	}
	s, err := graph.Open(w.d.home(), graph.Options{Create: true})
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	w.s = s
	if err := w.ack(guestproto.CutAck{Op: "init"}); err != nil {
		return err
	}
	w.layers, w.held = map[string]*known{}, map[string]bool{}
	infos, err := s.Layers()
	if err != nil {
		return err
	}
	for _, li := range infos {
		w.layers[li.ID] = &known{parent: li.Parent, rw: li.RW, applied: li.Applied, committed: li.Committed}
	}
	if err := w.p.send("begin", w.d.name, nil); err != nil {
		return err
	}
	for {
		if err := w.step(context.Background()); err != nil {
			return err
		}
	}
}

func (w *workload) ack(a guestproto.CutAck) error { return w.p.send("ack", w.d.name, a) }

func (w *workload) announce(a guestproto.CutAck) error { return w.p.send("op", w.d.name, a) }

// pick returns a random element of ids (sorted first: map order is not
// the seed's), or "".
func (w *workload) pick(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	sort.Strings(ids)
	return ids[w.rng.IntN(len(ids))]
}

func (w *workload) children(id string) int {
	n := 0
	for _, k := range w.layers {
		if k.parent == id {
			n++
		}
	}
	return n
}

// step runs one operation the seed picks among those the store allows.
func (w *workload) step(ctx context.Context) error {
	var applied, committed, empty, rws, leaves []string
	for id, k := range w.layers {
		switch {
		case k.rw:
			rws = append(rws, id)
		case k.applied:
			applied = append(applied, id)
			if k.committed {
				committed = append(committed, id)
			}
		case w.children(id) == 0:
			empty = append(empty, id)
		}
		if w.children(id) == 0 && !w.held[id] {
			leaves = append(leaves, id)
		}
	}
	w.n++
	full := len(w.layers) >= maxLayers
	r := w.rng.IntN(100)
	switch {
	case len(empty) > 0 && r < 70:
		return w.apply(ctx, w.pick(empty))
	case !full && (r < 25 || len(w.layers) < 3):
		parent := w.pick(applied)
		if w.rng.IntN(4) == 0 {
			parent = ""
		}
		return w.create(ctx, fmt.Sprintf("i%d-%d", w.boot, w.n), parent, false)
	case !full && r < 40 && len(applied) > 0:
		return w.create(ctx, fmt.Sprintf("c%d-%d", w.boot, w.n), w.pick(applied), true)
	case r < 65 && len(rws) > 0:
		return w.write(ctx, w.pick(rws))
	case r < 80 && len(committed) > 0:
		return w.read(ctx, w.pick(committed))
	case len(w.held) > 0 && r < 90:
		var ids []string
		for id := range w.held {
			ids = append(ids, id)
		}
		id := w.pick(ids)
		delete(w.held, id)
		return w.s.Put(ctx, id)
	case len(leaves) > 0:
		return w.remove(ctx, w.pick(leaves))
	}
	return nil
}

func (w *workload) create(ctx context.Context, id, parent string, rw bool) error {
	a := guestproto.CutAck{Op: "create", ID: id, Parent: parent, RW: rw}
	if err := w.announce(a); err != nil {
		return err
	}
	var err error
	if rw {
		err = w.s.CreateReadWrite(ctx, id, parent)
	} else {
		err = w.s.Create(ctx, id, parent)
	}
	if err != nil {
		return err
	}
	w.layers[id] = &known{parent: parent, rw: rw}
	if p := w.layers[parent]; p != nil {
		p.committed = true
	}
	return w.ack(a)
}

func (w *workload) apply(ctx context.Context, id string) error {
	c := content(id)
	if err := w.announce(guestproto.CutAck{Op: "apply", ID: id}); err != nil {
		return err
	}
	if _, err := w.s.ApplyDiff(ctx, id, bytes.NewReader(c.tar)); err != nil {
		return err
	}
	w.layers[id].applied = true
	return w.ack(guestproto.CutAck{Op: "apply", ID: id, Files: c.files})
}

// write writes a new file through a container layer's mount, fsyncs it
// and puts the layer.
func (w *workload) write(ctx context.Context, id string) error {
	name := fmt.Sprintf("/w-%d-%d", w.boot, w.n)
	if err := w.announce(guestproto.CutAck{Op: "write", ID: id, Files: map[string]string{name: ""}}); err != nil {
		return err
	}
	root, err := w.s.Get(ctx, id)
	if err != nil {
		return err
	}
	b := make([]byte, 1+w.rng.IntN(256<<10))
	for i := range b {
		b[i] = byte(w.rng.Uint32())
	}
	f, err := os.OpenFile(root+name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err == nil {
		_, err = f.Write(b)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if perr := w.s.Put(ctx, id); err == nil {
		err = perr
	}
	if err != nil {
		return fmt.Errorf("write %s in %s: %w", name, id, err)
	}
	sum := sha256.Sum256(b)
	return w.ack(guestproto.CutAck{Op: "write", ID: id, Files: map[string]string{name: hex.EncodeToString(sum[:])}})
}

// read gets a committed image layer, reads a file back and, now and then, keeps
// the layer mounted, so that a cut finds mounts and counts to recover.
func (w *workload) read(ctx context.Context, id string) error {
	root, err := w.s.Get(ctx, id)
	if err != nil {
		return err
	}
	// Every image layer has its own d/big, so the view shows the top's.
	b, err := os.ReadFile(filepath.Join(root, "d", "big"))
	if err != nil {
		return fmt.Errorf("read %s/d/big: %w", id, err)
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != content(id).files["/d/big"] {
		return fmt.Errorf("%s/d/big reads back wrong through the mount", id)
	}
	if !w.held[id] && len(w.held) < 2 && w.rng.IntN(3) == 0 {
		w.held[id] = true
		return nil
	}
	return w.s.Put(ctx, id)
}

func (w *workload) remove(ctx context.Context, id string) error {
	a := guestproto.CutAck{Op: "remove", ID: id}
	if err := w.announce(a); err != nil {
		return err
	}
	if err := w.s.Remove(ctx, id); err != nil {
		return err
	}
	delete(w.layers, id)
	return w.ack(a)
}
