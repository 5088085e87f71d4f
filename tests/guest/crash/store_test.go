//go:build ovlkit_guest

package crash

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/logwrites"
	"github.com/ovlkit/ovlkit/ovl"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// The layer store under power cuts: a store on the log-writes device
// creates, applies, mounts and writes, commits and removes layers, and marks the
// log after every call that returned (an acknowledgement). At every replay
// point the recovered filesystem is given to graph.Open, which recovers
// the store, and the checker counts the points that break each of the
// store's promises:
//
//   - complete or absent: every recorded layer verifies against its
//     manifest (graph.Verify: no damage), and an image layer recorded as
//     not applied holds nothing;
//   - check clean: graph.Check finds no problem after Open;
//   - no orphan: after Cleanup, staging/ is empty and nothing of the
//     store is mounted;
//   - nothing acknowledged lost: every Create, ApplyDiff, Commit and
//     Remove that returned before the point shows (the layer exists,
//     verifies with its content, is committed, or is gone);
//   - container writes kept: what a container wrote and fsynced through
//     its read-write mount before the point is in its layer. The store
//     does not promise this (it is the kernel's copy up under fsync=auto
//     or strict), so under auto it is a measurement, under strict a
//     violation.
//
// Besides, the Verify damage found at all points is summed, and a layer
// that a retry of the workload would apply again (present, not applied)
// is applied again with its tar, which must succeed.

const storeRowMarker = "crash-store-row: "

func TestStoreCrash(t *testing.T) {
	limit := pointLimit(t)
	release := kernelRelease(t)
	t.Logf("%skernel | fs | fsync | log entries | flush/FUA | replay points | complete or absent | check clean | orphans | acknowledged lost | container fsync lost | re-apply failed | damage found | unmountable or unopenable | time", storeRowMarker)
	for _, fsName := range []string{"ext4", "xfs"} {
		t.Run(fsName, func(t *testing.T) {
			d := readDisk(t, fsName)
			for _, mode := range []string{"auto", "strict"} {
				t.Run(mode, func(t *testing.T) {
					if mode == "auto" {
						guesttest.Keeps(t, "every layer of the store is complete or absent after a power cut at any flush")
					} else {
						declare(t, mode)
					}
					r := runStore(t, d, mode, limit)
					t.Logf("%s%s | %s | %s | %s", storeRowMarker, release, fsName, mode, r.row())
					r.judge(t)
				})
			}
		})
	}
}

// storeResult counts the replay points that break each promise.
type storeResult struct {
	refused                       error
	entries, flushes, points, all int
	torn, unclean, orphans, lost  int
	ctrLost, reapply, damage, bad int
	details                       []string
	took                          time.Duration
	strict                        bool
}

func (r *storeResult) row() string {
	if r.refused != nil {
		return fmt.Sprintf("- | - | notrun (store refused: %v) | - | - | - | - | - | - | - | - | %.0fs", r.refused, r.took.Seconds())
	}
	return fmt.Sprintf("%d | %d | %d of %d | %d | %d | %d | %d | %d | %d | %d | %d | %.0fs", r.entries, r.flushes, r.points, r.all,
		r.torn, r.unclean, r.orphans, r.lost, r.ctrLost, r.reapply, r.damage, r.bad, r.took.Seconds())
}

func (r *storeResult) detail(format string, args ...any) {
	if len(r.details) < 30 {
		r.details = append(r.details, fmt.Sprintf(format, args...))
	}
}

func (r *storeResult) judge(t *testing.T) {
	for _, d := range r.details {
		t.Log(d)
	}
	if r.refused != nil {
		t.Fatalf("the store was refused: %v", r.refused)
	}
	for _, v := range []struct {
		n    int
		what string
	}{
		{r.torn, "a layer neither complete nor absent"},
		{r.unclean, "problems in check after Open"},
		{r.orphans, "an orphan after Cleanup"},
		{r.lost, "an acknowledged store call undone"},
		{r.reapply, "a layer that cannot be applied again"},
		{r.bad, "a disk or store that did not open"},
	} {
		if v.n > 0 {
			t.Errorf("%d of %d replay points show %s", v.n, r.points, v.what)
		}
	}
	if r.ctrLost > 0 && r.strict {
		t.Errorf("%d of %d replay points lost a container write fsynced under fsync=strict", r.ctrLost, r.points)
	}
	if r.points == 0 {
		t.Error("no replay point was tried")
	}
}

// expect is what an acknowledged call promises from its mark on.
type expect struct {
	// start is the mark logged before the call ("" for container
	// writes), mark the one after it returned.
	start, mark string
	layer       string
	// want: "exists", "applied", "committed", "absent"; "file" for a
	// container write, with path and body.
	want       string
	path, body string
}

// storeWork is the store workload and what it acknowledged.
type storeWork struct {
	t       *testing.T
	s       *graph.Store
	lw      logWrites
	tars    map[string][]byte
	expects []expect
	n       int
	started string // the begin mark of the call under way
}

// begin marks the start of a store call: from there until its
// acknowledgement the layer may show the call's result or not.
func (w *storeWork) begin(id, want string) {
	w.n++
	w.started = fmt.Sprintf("begin-%02d-%s-%s", w.n, want, id)
	w.lw.mark(w.t, w.started)
}

func (w *storeWork) ack(e expect) {
	if w.started == "" {
		w.n++
	}
	e.start, w.started = w.started, ""
	e.mark = fmt.Sprintf("ack-%02d-%s-%s", w.n, e.want, e.layer)
	w.lw.mark(w.t, e.mark)
	w.expects = append(w.expects, e)
}

func (w *storeWork) create(id, parent string, rw bool) {
	ctx := context.Background()
	w.begin(id, "exists")
	var err error
	if rw {
		err = w.s.CreateReadWrite(ctx, id, parent)
	} else {
		err = w.s.Create(ctx, id, parent)
	}
	if err != nil {
		w.t.Fatalf("create %s: %v", id, err)
	}
	w.ack(expect{layer: id, want: "exists"})
}

func (w *storeWork) apply(id string) {
	w.begin(id, "applied")
	if _, err := w.s.ApplyDiff(context.Background(), id, bytes.NewReader(w.tars[id])); err != nil {
		w.t.Fatalf("apply %s: %v", id, err)
	}
	w.ack(expect{layer: id, want: "applied"})
}

// Tar members of the workload's layers.
type member struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
	xattr            string
}

func mkTar(t *testing.T, ms []member) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range ms {
		h := &tar.Header{Name: m.name, Typeflag: m.typ, Linkname: m.link, Mode: m.mode, Uid: m.uid, Gid: m.gid,
			Format: tar.FormatPAX, ModTime: time.Unix(1700000000, 0)}
		if m.typ == tar.TypeReg {
			h.Size = int64(len(m.body))
		}
		if m.xattr != "" {
			h.PAXRecords = map[string]string{"SCHILY.xattr.user.crash": m.xattr}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if m.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(m.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func reg(name string, body []byte, mode int64) member {
	return member{name: name, body: string(body), typ: tar.TypeReg, mode: mode}
}
func dirM(name string) member { return member{name: name, typ: tar.TypeDir, mode: 0o755} }

// storeTars are the layers: base (a large file, a hard link, a symlink,
// many small files, an owned file with an xattr), app (whiteout, opaque
// directory, new files), leaf (applied, then removed) and tail (applied
// last, after everything else was acknowledged).
func storeTars(t *testing.T) map[string][]byte {
	base := []member{dirM("etc/"), reg("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644),
		reg("etc/shadow", []byte("root:*::\n"), 0o600), dirM("bin/"), reg("bin/big", pattern(1, 1<<20+17), 0o755),
		{name: "bin/ash", link: "bin/big", typ: tar.TypeLink, mode: 0o755},
		{name: "lib", link: "usr/lib", typ: tar.TypeSymlink, mode: 0o777},
		dirM("usr/"), dirM("usr/lib/"), dirM("usr/share/"), dirM("usr/share/doc/"),
		{name: "etc/owned", body: "owned\n", typ: tar.TypeReg, mode: 0o640, uid: lowerUID, gid: lowerGID, xattr: "base"},
		dirM("var/"), dirM("var/cache/"), reg("var/cache/old", []byte("old cache"), 0o644)}
	for i := 0; i < 150; i++ {
		base = append(base, reg(fmt.Sprintf("usr/share/doc/f%03d", i), pattern(i, 300+i*13), 0o644))
	}
	app := []member{dirM("etc/"), reg("etc/app.conf", []byte("on\n"), 0o644), reg("etc/.wh.shadow", nil, 0o644),
		dirM("var/"), dirM("var/cache/"), reg("var/cache/.wh..wh..opq", nil, 0o644), reg("var/cache/new", []byte("new cache"), 0o644),
		dirM("opt/"), reg("opt/app", pattern(7, 200<<10), 0o755)}
	leaf := []member{reg("leaf", pattern(9, 64<<10), 0o644)}
	var tail []member
	tail = append(tail, dirM("tail/"))
	for i := 0; i < 40; i++ {
		tail = append(tail, reg(fmt.Sprintf("tail/f%02d", i), pattern(i+50, 1000+i*31), 0o644))
	}
	return map[string][]byte{"base": mkTar(t, base), "app": mkTar(t, app), "leaf": mkTar(t, leaf), "tail": mkTar(t, tail)}
}

func storeOptions(feat *ovl.Features, mode string) graph.Options {
	return graph.Options{Features: feat, FsyncStrict: mode == "strict", Layout: graph.LayoutOverlay}
}

func runStore(t *testing.T, d disk, mode string, limit int) *storeResult {
	start := time.Now()
	r := &storeResult{strict: mode == "strict"}
	defer func() { r.took = time.Since(start) }()
	var (
		w    *storeWork
		feat ovl.Features
	)
	tars := storeTars(t)
	rec, refused := record(t, d, "store-"+mode, func(fsRoot string, lw logWrites) error {
		probe := filepath.Join(fsRoot, "probe")
		if err := os.Mkdir(probe, 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if feat, err = ovl.Probe(probe); err != nil {
			t.Fatalf("probe: %v", err)
		}
		o := storeOptions(&feat, mode)
		o.Create = true
		s, err := graph.Open(filepath.Join(fsRoot, "store"), o)
		if err != nil {
			return err
		}
		defer s.Close()
		unix.Sync()
		lw.mark(t, "ready")
		w = &storeWork{t: t, s: s, lw: lw, tars: tars}
		w.run()
		if err := s.Cleanup(); err != nil {
			t.Fatalf("cleanup: %v", err)
		}
		return nil
	})
	if refused != nil {
		r.refused = refused
		return r
	}
	t.Logf("workload done in %.1fs", time.Since(start).Seconds())
	r.entries, r.flushes = len(rec.log.Entries), rec.flushes
	pts, all := rec.points(limit)
	r.points, r.all = len(pts), all
	t.Logf("log: %d entries, %d flush/FUA, %d KiB; trying %d of %d replay points", r.entries, r.flushes, rec.logSize>>10, len(pts), all)
	unmountable, details := rec.replay(t, pts, func(p logwrites.Point, mnt string) {
		checkStore(t, r, w, rec, p, mnt, storeOptions(&feat, mode), d.fs+" "+mode)
	})
	r.bad += unmountable
	r.details = append(r.details, details...)
	return r
}

// run is the workload: each call is acknowledged by a mark once it
// returned.
func (w *storeWork) run() {
	t := w.t
	ctx := context.Background()
	w.create("base", "", false)
	w.apply("base")
	w.create("app", "base", false)
	w.apply("app")
	w.create("ctr", "app", true)

	// The mount/write/umount cycle of a container: a new file, a copy
	// up of a base file with an append, a chmod (metadata copy up); each
	// fsynced by the container before it counts as written.
	root, err := w.s.Get(ctx, "ctr")
	if err != nil {
		t.Fatalf("get ctr: %v", err)
	}
	write := func(rel string, body []byte, flags int) {
		f, err := os.OpenFile(filepath.Join(root, rel), os.O_WRONLY|flags, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(body); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatalf("fsync %s: %v", rel, err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write("ctr-new", []byte("written by the container\n"), os.O_CREATE|os.O_EXCL)
	w.ack(expect{layer: "ctr", want: "file", path: "ctr-new", body: "written by the container\n"})
	write("etc/passwd", []byte("app:x:1000:1000::/app:/bin/sh\n"), os.O_APPEND)
	w.ack(expect{layer: "ctr", want: "file", path: "etc/passwd", body: "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/app:/bin/sh\n"})
	if err := os.Chmod(filepath.Join(root, "opt/app"), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(root, "opt/app"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync opt/app: %v", err)
	}
	f.Close()
	w.ack(expect{layer: "ctr", want: "file", path: "opt/app", body: string(pattern(7, 200<<10))})
	if err := w.s.Put(ctx, "ctr"); err != nil {
		t.Fatalf("put ctr: %v", err)
	}
	w.begin("ctr", "committed")
	if err := w.s.Commit(ctx, "ctr"); err != nil {
		t.Fatalf("commit ctr: %v", err)
	}
	w.ack(expect{layer: "ctr", want: "committed"})

	// A layer made and removed.
	w.create("leaf", "base", false)
	w.apply("leaf")
	w.begin("leaf", "absent")
	if err := w.s.Remove(ctx, "leaf"); err != nil {
		t.Fatalf("remove leaf: %v", err)
	}
	w.ack(expect{layer: "leaf", want: "absent"})

	// The last layer: nothing is acknowledged after it.
	w.create("tail", "app", false)
	w.apply("tail")
}

// checkStore opens the store on the recovered filesystem and counts what
// breaks at point p.
func checkStore(t *testing.T, r *storeResult, w *storeWork, rec *recording, p logwrites.Point, mnt string, o graph.Options, run string) {
	where := fmt.Sprintf("%s point %d (%s, after mark %q)", run, p.Applied, p.Why, p.Mark)
	ctx := context.Background()
	home := filepath.Join(mnt, "store")
	s, err := graph.Open(home, o)
	if err != nil {
		r.bad++
		r.detail("%s: open: %v", where, err)
		return
	}
	defer s.Close()
	torn, unclean, orphans, lost, ctrLost, reapply := false, false, false, false, false, false

	reps, err := s.VerifyAll(ctx)
	if err != nil {
		t.Fatalf("%s: verify: %v", where, err)
	}
	state := map[string]graph.Report{}
	for _, rep := range reps {
		state[rep.Layer] = rep
		r.damage += len(rep.Damage)
		if rep.State == graph.StateDamaged || rep.State == graph.StateNoManifest {
			torn = true
			r.detail("%s: layer %s is %s: %v", where, rep.Layer, rep.State, rep.Damage)
		}
		if _, ok := w.tars[rep.Layer]; ok && rep.State == graph.StateEmpty {
			if ents, err := os.ReadDir(filepath.Join(home, "layers", rep.Layer, "diff")); err != nil || len(ents) > 0 {
				torn = true
				r.detail("%s: layer %s is recorded empty but its diff holds %d entries (%v)", where, rep.Layer, len(ents), err)
			}
		}
	}
	if probs, err := s.Check(); err != nil {
		t.Fatalf("%s: check: %v", where, err)
	} else if len(probs) > 0 {
		unclean = true
		r.detail("%s: check: %s", where, graph.Summary(probs))
	}

	// What was acknowledged before p, the last promise per layer, and
	// the call under way at p, whose result may show already.
	last, flight := map[string]expect{}, map[string]expect{}
	for _, e := range w.expects {
		acked := rec.has(e.mark, p.Applied)
		if e.want == "file" {
			if !acked {
				continue
			}
			got, err := os.ReadFile(filepath.Join(home, "layers", e.layer, "diff", e.path))
			if err != nil || string(got) != e.body {
				ctrLost = true
				r.detail("%s: container file %s (%s): %d bytes, %v; want %d bytes", where, e.path, e.mark, len(got), err, len(e.body))
			}
			continue
		}
		if acked {
			last[e.layer] = e
		} else if e.start != "" && rec.has(e.start, p.Applied) {
			flight[e.layer] = e
		}
	}
	shows := func(id string, e expect) bool {
		rep, present := state[id]
		switch e.want {
		case "exists":
			return present
		case "applied":
			return present && rep.State == graph.StateOK
		case "committed":
			li, err := s.Layer(id)
			return present && err == nil && li.Committed
		case "absent":
			return !present
		}
		return false
	}
	for id, e := range last {
		if shows(id, e) {
			continue
		}
		if f, ok := flight[id]; ok && shows(id, f) {
			continue
		}
		lost = true
		rep, present := state[id]
		r.detail("%s: %s acknowledged, but the layer is %v (present %v)", where, e.mark, rep.State, present)
	}

	// A retry of the workload applies again what is not applied.
	for _, id := range []string{"base", "app", "leaf", "tail"} {
		if rep, ok := state[id]; ok && rep.State == graph.StateEmpty {
			if _, err := s.ApplyDiff(ctx, id, bytes.NewReader(w.tars[id])); err != nil {
				reapply = true
				r.detail("%s: apply %s again: %v", where, id, err)
				continue
			}
			if rep, err := s.Verify(ctx, id); err != nil || rep.State != graph.StateOK {
				reapply = true
				r.detail("%s: %s applied again is %s %v (%v)", where, id, rep.State, rep.Damage, err)
			}
		}
	}

	if err := s.Cleanup(); err != nil {
		orphans = true
		r.detail("%s: cleanup: %v", where, err)
	}
	if ents, err := os.ReadDir(filepath.Join(home, "staging")); err != nil || len(ents) > 0 {
		orphans = true
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		r.detail("%s: staging/ after Open and Cleanup: %v (%v)", where, names, err)
	}
	if mps, err := ovl.MountsBeneath(home); err != nil || len(mps) > 0 {
		orphans = true
		r.detail("%s: mounts left under the store: %v (%v)", where, mps, err)
	}
	if probs, err := s.Check(); err == nil && len(probs) > 0 && !unclean {
		orphans = true
		r.detail("%s: check after re-apply and Cleanup: %s", where, graph.Summary(probs))
	}
	for _, v := range []struct {
		b bool
		n *int
	}{{torn, &r.torn}, {unclean, &r.unclean}, {orphans, &r.orphans}, {lost, &r.lost}, {ctrLost, &r.ctrLost}, {reapply, &r.reapply}} {
		if v.b {
			*v.n++
		}
	}
}
