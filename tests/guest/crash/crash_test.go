//go:build ovlkit_guest

// Package crash cuts the power under copy-up, in replay: a workload copies
// files and directories up into an overlay whose upper filesystem (ext4,
// xfs) sits on a dm-log-writes device, which records every write, flush
// and FUA in completion order, and marks where the workload synced. The
// checker then rebuilds the upper disk as it was at every flush, FUA write
// and mark, and at sampled points between them (package logwrites), lets
// the filesystem recover it as a reboot would, stacks the overlay on it
// again read-only, and checks every path the workload touched:
//
//   - old or new: each path shows the lower's content and attributes, or
//     one of the states the workload gave it, never a truncated,
//     zero-filled or ownerless copy. An append the workload had not
//     synced yet may show in part (the old content intact, then some of
//     the appended bytes or zeros): no filesystem promises more for an
//     unsynced write, copy up or not, so those points are counted in a
//     column of their own;
//   - kept after sync: what was copied up and changed before a sync()
//     or fsync() the workload completed shows at least that change
//     afterwards.
//
// The workload copies up large files (a block rewritten, fsync), many
// small files (append, sync), directories (a new file in each, chmod),
// metadata only (chmod, chown, setxattr) and metadata then data (chown,
// append, fsync). It runs with fsync=auto (the default) and fsync=strict,
// each with metacopy off and on, and prints one table row per
// filesystem, mode and metacopy (rowMarker). A violation of "old or new"
// fails the test in either mode, one of "kept after sync" only under
// fsync=strict; under auto the count is reported as a measurement.
//
// TestStoreCrash does the same for the layer store (package graph): see
// store_test.go.
//
// It needs CONFIG_BLK_DEV_DM and CONFIG_DM_LOG_WRITES (kconfig/guest.config
// has them) and the ext4 and xfs disks of the harness (it reads their
// freshly made filesystems; the guest has no mkfs), and takes minutes per
// filesystem under TCG. It is a module of its own so that the default
// package pattern (./tests/guest/...) does not reach it: "make crash-test"
// runs all of it, and "make crash-replay-short" (part of "make test") a
// fixed few runs with few replay points.
package crash

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/logwrites"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// rowMarker starts the log lines that make up the documentation table.
const rowMarker = "crash-row: "

const subjectFsync = "ovl: add fsync=auto|strict|volatile mount option"

// The owner of everything in the lower layer: a copy up that loses it
// shows root's instead.
const lowerUID, lowerGID = 1234, 5678

func TestCopyUpCrash(t *testing.T) {
	limit := pointLimit(t)
	release := kernelRelease(t)
	t.Logf("%skernel | fs | fsync | metacopy | log entries | flush/FUA | replay points | old or new: violating points | kept after sync: violating points | unsynced append in part | unmountable | time", rowMarker)
	for _, fsName := range []string{"ext4", "xfs"} {
		t.Run(fsName, func(t *testing.T) {
			d := readDisk(t, fsName)
			for _, mode := range []string{"auto", "strict"} {
				for _, metacopy := range []bool{false, true} {
					c := runConfig{d: d, mode: mode, metacopy: metacopy, limit: limit}
					t.Run(c.name(), func(t *testing.T) {
						declare(t, mode)
						r := run(t, c)
						t.Logf("%s%s | %s | %s | %s | %s", rowMarker, release, fsName, mode, onOff(metacopy), r.row())
						r.judge(t)
					})
				}
			}
		})
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// declare says what the subtest of mode is to the harness. fsync=strict is
// the series' option on 6.1, refused by stock, so there the strict run
// proves it; 6.12's stock kernel has the option itself.
func declare(t *testing.T, mode string) {
	if mode == "auto" {
		guesttest.Keeps(t, "copy up shows old or new content and attributes after a power cut at any flush")
		return
	}
	guesttest.ForBase(t, map[string]func(){
		"6.1":  func() { guesttest.Proves(t, subjectFsync) },
		"6.12": func() { guesttest.Keeps(t, "fsync=strict copy up survives a power cut after sync") },
	})()
}

type runConfig struct {
	d        disk
	mode     string
	metacopy bool
	limit    int
}

func (c runConfig) name() string {
	if c.metacopy {
		return c.mode + "-metacopy"
	}
	return c.mode
}

// result counts one run's replay points and violations.
type result struct {
	refused              error // the overlay mount of the mode was refused
	entries, flushes     int
	points, all          int // replay points tried, and before sampling
	torn, lost, unmounts int
	// partial: points where an append not yet synced shows in part.
	partial, partialShown int
	// lostAllowed: "kept after sync" is a measurement here, not a
	// guarantee.
	lostAllowed bool
	details     []string
	took        time.Duration
}

func (r *result) row() string {
	if r.refused != nil {
		return fmt.Sprintf("- | - | notrun (mount refused: %v) | - | - | - | - | %.0fs", r.refused, r.took.Seconds())
	}
	return fmt.Sprintf("%d | %d | %d of %d | %d | %d | %d | %d | %.0fs",
		r.entries, r.flushes, r.points, r.all, r.torn, r.lost, r.partial, r.unmounts, r.took.Seconds())
}

func (r *result) judge(t *testing.T) {
	for _, d := range r.details {
		t.Log(d)
	}
	if r.refused != nil {
		t.Fatalf("the overlay mount was refused: %v", r.refused)
	}
	if r.torn > 0 {
		t.Errorf("%d of %d replay points show a path in neither its old nor a new state", r.torn, r.points)
	}
	if r.unmounts > 0 {
		t.Errorf("%d of %d replayed disks did not mount", r.unmounts, r.points)
	}
	if r.lost > 0 && !r.lostAllowed {
		t.Errorf("%d of %d replay points lost a copy up made before a completed sync", r.lost, r.points)
	}
	if r.points == 0 {
		t.Error("no replay point was tried")
	}
}

// detail keeps the first few violation descriptions for the log.
func (r *result) detail(format string, args ...any) {
	if len(r.details) < 20 {
		r.details = append(r.details, fmt.Sprintf(format, args...))
	}
}

func run(t *testing.T, c runConfig) *result {
	start := time.Now()
	r := &result{lostAllowed: c.mode == "auto"}
	defer func() { r.took = time.Since(start) }()
	lower := guesttest.FS{Name: "tmpfs"}.Scratch(t, "")
	var w *workload
	rec, refused := record(t, c.d, c.name(), func(fsRoot string, lw logWrites) error {
		w = newWorkload(t, lower, lw)
		merged := filepath.Join(filepath.Dir(fsRoot), "merged")
		if err := os.Mkdir(merged, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, d := range []string{"upper", "work"} {
			if err := os.Mkdir(filepath.Join(fsRoot, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		unix.Sync()
		lw.mark(t, "ready")
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, filepath.Join(fsRoot, "upper"), filepath.Join(fsRoot, "work"))
		if c.metacopy {
			opts += ",metacopy=on"
		}
		// fsync=auto is the default; it is not named, so that the
		// same mount runs on stock, which does not know the option.
		if c.mode == "strict" {
			opts += ",fsync=strict"
		}
		if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
			return err
		}
		w.merged = merged
		w.snapshot()
		w.run()
		unmount(t, merged)
		return nil
	})
	if refused != nil {
		r.refused = refused
		return r
	}
	t.Logf("workload done in %.1fs", time.Since(start).Seconds())
	for _, s := range w.syncs {
		if _, ok := rec.marks[s.mark]; !ok {
			t.Fatalf("the log has no mark %q (marks: %v)", s.mark, rec.marks)
		}
	}
	r.entries, r.flushes = len(rec.log.Entries), rec.flushes
	pts, all := rec.points(c.limit)
	r.all = all
	t.Logf("log: %d entries, %d flush/FUA, %d KiB; trying %d of %d replay points", r.entries, r.flushes, rec.logSize>>10, len(pts), all)
	view := filepath.Join(rec.dir, "view")
	if err := os.Mkdir(view, 0o755); err != nil {
		t.Fatal(err)
	}
	unmountable, details := rec.replay(t, pts, func(p logwrites.Point, mnt string) {
		// The sync in effect: the last one whose mark the point has.
		var need map[string]int
		for _, s := range w.syncs {
			if rec.has(s.mark, p.Applied) {
				need = s.need
			}
		}
		checkPoint(t, c, r, w, p, mnt, view, lower, need)
	})
	r.points = len(pts)
	r.unmounts += unmountable
	r.details = append(r.details, details...)
	return r
}

// state is what a path looks like through the overlay at one moment.
type state struct {
	exists, dir bool
	size        int64
	sum         [32]byte
	mode        uint32
	uid, gid    uint32
	xattr       string // user.crash, "" when absent
	// data is the content of a file of up to smallData bytes, which
	// partialAppend compares byte by byte.
	data string
}

const smallData = 64 << 10

func (s state) String() string {
	if !s.exists {
		return "absent"
	}
	kind := "file"
	if s.dir {
		kind = "dir"
	}
	return fmt.Sprintf("%s %d bytes sha256 %x mode %o owner %d:%d xattr %q",
		kind, s.size, s.sum[:4], s.mode&0o7777, s.uid, s.gid, s.xattr)
}

// observe reads path's state.
func observe(path string) (state, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return state{}, nil
		}
		return state{}, fmt.Errorf("lstat %s: %w", path, err)
	}
	s := state{exists: true, dir: st.Mode&unix.S_IFMT == unix.S_IFDIR, mode: st.Mode, uid: st.Uid, gid: st.Gid}
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(path, "user.crash", buf)
	switch {
	case err == nil:
		s.xattr = string(buf[:n])
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.EOPNOTSUPP):
		// No such xattr; a lower tmpfs has no user xattrs at all.
	default:
		return state{}, fmt.Errorf("getxattr %s: %w", path, err)
	}
	if s.dir {
		return s, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return state{}, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return state{}, fmt.Errorf("read %s: %w", path, err)
	}
	s.size, s.sum = int64(len(b)), sha256.Sum256(b)
	if len(b) <= smallData {
		s.data = string(b)
	}
	return s, nil
}

// partialAppend reports whether got is states[i] (i > 0), an append to
// states[i-1], persisted in part: the earlier content intact, the size
// anywhere from the old to the new one, and each byte past the old size
// either the appended one or zero. A write the application did not sync
// gets no promise from any filesystem (ext4 can commit the new size
// before the data, or write back the first of two blocks); what copy up
// must keep is the content before it. The attributes must be those of
// one of the two states.
func partialAppend(states []state, i int, got state) bool {
	old, cur := states[i-1], states[i]
	if !got.exists || got.dir || !old.exists || old.dir || !cur.exists || cur.dir {
		return false
	}
	if cur.size <= old.size || len(cur.data) != int(cur.size) || len(old.data) != int(old.size) || len(got.data) != int(got.size) {
		return false
	}
	if got.size < old.size || got.size > cur.size || got.data[:old.size] != old.data {
		return false
	}
	for k := old.size; k < got.size; k++ {
		if got.data[k] != cur.data[k] && got.data[k] != 0 {
			return false
		}
	}
	sameAttrs := func(a state) bool {
		return a.mode == got.mode && a.uid == got.uid && a.gid == got.gid && a.xattr == got.xattr
	}
	return sameAttrs(old) || sameAttrs(cur)
}

// workload makes the lower layer, copies up through the overlay and
// records every state each path went through.
type workload struct {
	t      *testing.T
	lower  string
	merged string
	lw     logWrites
	order  []string
	states map[string][]state // [0] is the lower's
	// syncs are the completed syncs, in order: the mark logged after
	// each, and for every path it covered the state it must keep.
	syncs []syncPoint
}

type syncPoint struct {
	mark string
	need map[string]int
}

// Sizes of the workload: small enough for minutes under TCG, large enough
// for copy ups of several extents and of hundreds of inodes.
const (
	nLarge, largeSize = 3, 2 << 20
	nSmall            = 48
	nDirs             = 6
	nMeta             = 24
	nMetaData         = 12
	nTail             = 16
)

func pattern(seed, size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte((i+seed*7)%251 + 1)
	}
	return b
}

func newWorkload(t *testing.T, lower string, lw logWrites) *workload {
	w := &workload{t: t, lower: lower, lw: lw, states: map[string][]state{}}
	file := func(rel string, size int, mode os.FileMode) {
		p := filepath.Join(lower, rel)
		if err := os.WriteFile(p, pattern(len(w.order), size), mode); err != nil {
			t.Fatal(err)
		}
		w.own(p, mode)
		w.order = append(w.order, rel)
	}
	dir := func(rel string, mode os.FileMode) {
		p := filepath.Join(lower, rel)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		w.own(p, mode)
		w.order = append(w.order, rel)
	}
	for _, d := range []string{"large", "small", "meta", "metadata", "tail"} {
		dir(d, 0o755)
	}
	for i := 0; i < nLarge; i++ {
		file(fmt.Sprintf("large/f%d", i), largeSize, 0o640)
	}
	for i := 0; i < nSmall; i++ {
		file(fmt.Sprintf("small/f%02d", i), 512+i*160, 0o644)
	}
	for i := 0; i < nDirs; i++ {
		d := fmt.Sprintf("d%d", i)
		dir(d, 0o750)
		file(d+"/a", 1000, 0o644)
		// Created through the overlay: absent in the lower.
		w.order = append(w.order, d+"/new")
	}
	for i := 0; i < nMeta; i++ {
		file(fmt.Sprintf("meta/f%02d", i), 3000, 0o640)
	}
	for i := 0; i < nMetaData; i++ {
		file(fmt.Sprintf("metadata/f%02d", i), 5000+i*700, 0o644)
	}
	for i := 0; i < nTail; i++ {
		file(fmt.Sprintf("tail/f%02d", i), 2000, 0o644)
	}
	return w
}

func (w *workload) own(p string, mode os.FileMode) {
	// Not subject to the umask.
	if err := os.Chmod(p, mode); err != nil {
		w.t.Fatal(err)
	}
	if err := os.Lchown(p, lowerUID, lowerGID); err != nil {
		w.t.Fatal(err)
	}
}

// snapshot records every path as the overlay shows it before any change.
func (w *workload) snapshot() {
	for _, rel := range w.order {
		w.states[rel] = nil
		w.record(rel)
	}
}

// record appends the state rel shows now, when it changed.
func (w *workload) record(rel string) {
	s, err := observe(filepath.Join(w.merged, rel))
	if err != nil {
		w.t.Fatal(err)
	}
	h := w.states[rel]
	if len(h) == 0 || h[len(h)-1] != s {
		w.states[rel] = append(h, s)
	}
}

// synced records a completed sync covering paths (every path when nil)
// and marks it in the log.
func (w *workload) synced(name string, paths []string) {
	need := map[string]int{}
	if n := len(w.syncs); n > 0 {
		for p, i := range w.syncs[n-1].need {
			need[p] = i
		}
	}
	if paths == nil {
		paths = w.order
	}
	for _, p := range paths {
		if h := w.states[p]; len(h) > 1 {
			need[p] = len(h) - 1
		}
	}
	mark := "sync-" + name
	w.lw.mark(w.t, mark)
	w.syncs = append(w.syncs, syncPoint{mark: mark, need: need})
}

func (w *workload) path(rel string) string { return filepath.Join(w.merged, rel) }

func (w *workload) run() {
	t := w.t
	// Large files: a 4 KiB block rewritten in the middle (one block:
	// the write itself is not torn on replay), then fsync of the file.
	var large []string
	for i := 0; i < nLarge; i++ {
		rel := fmt.Sprintf("large/f%d", i)
		f, err := os.OpenFile(w.path(rel), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(bytes.Repeat([]byte{byte('A' + i)}, 4096), largeSize/2); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatalf("fsync %s: %v", rel, err)
		}
		f.Close()
		w.record(rel)
		large = append(large, rel)
	}
	w.synced("large", large)

	// Many small files: an append to each, then sync().
	for i := 0; i < nSmall; i++ {
		w.appendTo(fmt.Sprintf("small/f%02d", i))
	}
	unix.Sync()
	w.synced("small", nil)

	// Directories: a new file in each copies the directory up; half
	// of them then get a new mode. The new file is recorded empty
	// too: a cut between its creation and the writeback of its data
	// leaves it so on any filesystem, copy up or not.
	for i := 0; i < nDirs; i++ {
		d := fmt.Sprintf("d%d", i)
		f, err := os.OpenFile(w.path(d+"/new"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		w.record(d)
		w.record(d + "/new")
		if _, err := f.WriteString("new file in " + d); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		w.record(d + "/new")
		if i%2 == 0 {
			if err := os.Chmod(w.path(d), 0o700); err != nil {
				t.Fatal(err)
			}
			w.record(d)
		}
	}
	unix.Sync()
	w.synced("dirs", nil)

	// Metadata only: chmod, chown, setxattr, and all three.
	for i := 0; i < nMeta; i++ {
		w.meta(fmt.Sprintf("meta/f%02d", i), i%4)
	}
	unix.Sync()
	w.synced("meta", nil)

	// Metadata, then data: with metacopy=on the chown copies up the
	// attributes only and the append then copies the data up and
	// removes the metacopy xattr; a cut between the two must not show
	// the file without its data. Then fsync of the file.
	var md []string
	for i := 0; i < nMetaData; i++ {
		rel := fmt.Sprintf("metadata/f%02d", i)
		w.meta(rel, 1)
		f, err := os.OpenFile(w.path(rel), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(bytes.Repeat([]byte("data after metadata "), 9)); err != nil {
			t.Fatal(err)
		}
		w.record(rel)
		if err := f.Sync(); err != nil {
			t.Fatalf("fsync %s: %v", rel, err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		md = append(md, rel)
	}
	w.synced("metadata", md)

	// Copy ups after the last sync: only "old or new" applies to them.
	for i := 0; i < nTail; i++ {
		rel := fmt.Sprintf("tail/f%02d", i)
		if i%2 == 0 {
			w.appendTo(rel)
		} else {
			w.meta(rel, 3)
		}
	}
}

func (w *workload) appendTo(rel string) {
	f, err := os.OpenFile(w.path(rel), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		w.t.Fatal(err)
	}
	if _, err := f.Write(bytes.Repeat([]byte("appended "), 11)); err != nil {
		w.t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		w.t.Fatal(err)
	}
	w.record(rel)
}

// meta changes attributes only: 0 chmod, 1 chown, 2 setxattr, 3 all.
func (w *workload) meta(rel string, how int) {
	p := w.path(rel)
	if how == 0 || how == 3 {
		if err := os.Chmod(p, 0o604); err != nil {
			w.t.Fatal(err)
		}
		w.record(rel)
	}
	if how == 1 || how == 3 {
		if err := os.Lchown(p, 4321, 8765); err != nil {
			w.t.Fatal(err)
		}
		w.record(rel)
	}
	if how == 2 || how == 3 {
		if err := unix.Lsetxattr(p, "user.crash", []byte("set "+rel), 0); err != nil {
			w.t.Fatalf("setxattr %s: %v", rel, err)
		}
		w.record(rel)
	}
}

// checkPoint stacks the overlay read-only on the recovered upper at mnt
// and compares every path with its states.
func checkPoint(t *testing.T, c runConfig, r *result, w *workload, p logwrites.Point, mnt, view, lower string, need map[string]int) {
	where := fmt.Sprintf("%s %s point %d (%s, after mark %q)", c.d.fs, c.name(), p.Applied, p.Why, p.Mark)
	// The upper layer as the top lower layer: the same lookup as the
	// overlay after a reboot, and nothing is written. A metacopy upper
	// needs metacopy=on to find its data in the layer below.
	opts := fmt.Sprintf("lowerdir=%s:%s", filepath.Join(mnt, "upper"), lower)
	if c.metacopy {
		opts += ",metacopy=on"
	}
	if err := unix.Mount("overlay", view, "overlay", unix.MS_RDONLY, opts); err != nil {
		r.unmounts++
		r.detail("%s: overlay over the replayed %s does not mount: %v", where, c.d.fs, err)
		return
	}
	defer unmount(t, view)
	torn, lost, partial := false, false, false
	names := append([]string(nil), w.order...)
	sort.Strings(names)
	for _, rel := range names {
		got, err := observe(filepath.Join(view, rel))
		if err != nil {
			torn = true
			r.detail("%s: %s: %v", where, rel, err)
			continue
		}
		states := w.states[rel]
		best := -1
		for i, s := range states {
			if s == got {
				best = i
			}
		}
		if best < 0 {
			for i := 1; i < len(states); i++ {
				if partialAppend(states, i, got) {
					// Short of state i: "kept after sync"
					// below needs i to count it kept.
					best = i - 1
					partial = true
					if r.partialShown < 3 {
						r.partialShown++
						r.detail("%s: %s is %v, an unsynced append to it persisted in part (not counted against copy up)", where, rel, got)
					}
					break
				}
			}
		}
		if best < 0 {
			torn = true
			var want []string
			for _, s := range states {
				want = append(want, s.String())
			}
			r.detail("%s: %s is %v, neither of its states [%s]", where, rel, got, strings.Join(want, "; "))
			continue
		}
		if n, ok := need[rel]; ok && best < n {
			lost = true
			r.detail("%s: %s is in state %d of %d (%v), but a completed sync covered state %d",
				where, rel, best, len(states)-1, got, n)
		}
	}
	if torn {
		r.torn++
	}
	if lost {
		r.lost++
	}
	if partial {
		r.partial++
	}
}
