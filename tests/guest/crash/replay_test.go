//go:build ovlkit_guest

package crash

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/logwrites"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// The two workloads (copy up, the layer store) share the recording and the
// replay: record runs a workload on a filesystem on a dm-log-writes
// device, replay rebuilds the disk at each chosen point and hands the
// recovered filesystem to the workload's checker.

// maxPoints bounds the replay points tried per run (marks are always
// tried); OVLKIT_CRASH_POINTS overrides it.
const maxPoints = 40

func pointLimit(t *testing.T) int {
	v := os.Getenv("OVLKIT_CRASH_POINTS")
	if v == "" {
		return maxPoints
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("OVLKIT_CRASH_POINTS=%q: want a positive number", v)
	}
	return n
}

func kernelRelease(t *testing.T) string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	return unix.ByteSliceToString(u.Release[:])
}

// disk is a harness disk read into a sparse image on a tmpfs, which every
// run of a workload on that filesystem starts from.
type disk struct {
	fs   string
	work string // the tmpfs
	base string // the image
	size int64
}

func readDisk(t *testing.T, fsName string) disk {
	d := guesttest.NeedFS(t, fsName)
	work := guesttest.FS{Name: "tmpfs"}.Scratch(t, "size=1400m")
	base := filepath.Join(work, "base.img")
	start := time.Now()
	size := imageOf(t, d.Device, base)
	t.Logf("%s: %d MiB disk read into a sparse image in %.1fs", d.Device, size>>20, time.Since(start).Seconds())
	return disk{fs: fsName, work: work, base: base, size: size}
}

func fsOptions(fs string) string {
	if fs == "ext4" {
		// No background zeroing of inode tables: it would log
		// megabytes of zeros that have nothing to do with the
		// workload.
		return "noinit_itable"
	}
	return ""
}

// recording is the log of one workload run.
type recording struct {
	d       disk
	dir     string // the run's directory on the tmpfs
	log     *logwrites.Log
	logFile *os.File
	logSize int64          // bytes the log holds (its file is sparse)
	marks   map[string]int // mark name -> entries applied just after it
	flushes int
}

// record runs work on a fresh copy of d's filesystem mounted at fsRoot on a
// dm-log-writes device called name. work must log the mark "ready" once
// its setup is done: replay starts there. refused is what work returns
// when the kernel refuses what the run needs (an unknown mount option);
// nothing is recorded then. The run's directory is removed when the test
// ends.
func record(t *testing.T, d disk, name string, work func(fsRoot string, lw logWrites) (refused error)) (*recording, error) {
	dir := filepath.Join(d.work, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	dataImg, logImg := filepath.Join(dir, "data.img"), filepath.Join(dir, "log.img")
	if err := copySparse(dataImg, d.base); err != nil {
		t.Fatalf("copy the base image: %v", err)
	}
	sparseFile(t, logImg, 2<<30)
	data, logd := attachLoop(t, dataImg), attachLoop(t, logImg)
	lw := createLogWrites(t, "ovlcrash-"+name, dir, data, logd, uint64(d.size/512))
	fsRoot := filepath.Join(dir, "fs")
	if err := os.Mkdir(fsRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(lw.Path, fsRoot, d.fs, 0, fsOptions(d.fs)); err != nil {
		t.Fatalf("mount %s on the log-writes device: %v", d.fs, err)
	}
	refused := work(fsRoot, lw)
	unmount(t, fsRoot)
	if refused != nil {
		return nil, refused
	}
	// The target writes its final super block when it is removed.
	if err := lw.remove(); err != nil {
		t.Fatal(err)
	}
	if err := data.detach(); err != nil {
		t.Fatal(err)
	}
	os.Remove(dataImg)
	lf, err := os.Open(logImg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lf.Close() })
	fi, err := lf.Stat()
	if err != nil {
		t.Fatal(err)
	}
	l, err := logwrites.Decode(lf, fi.Size())
	if err != nil {
		t.Fatalf("decode the log: %v", err)
	}
	rec := &recording{d: d, dir: dir, log: l, logFile: lf, marks: map[string]int{}}
	var st unix.Stat_t
	if err := unix.Fstat(int(lf.Fd()), &st); err == nil {
		rec.logSize = st.Blocks * 512
	}
	for _, e := range l.Entries {
		if e.IsFlush() || e.IsFUA() {
			rec.flushes++
		}
		if e.IsMark() {
			rec.marks[e.Mark] = e.Index + 1
		}
	}
	if _, ok := rec.marks["ready"]; !ok {
		t.Fatal("the log has no mark \"ready\"")
	}
	return rec, nil
}

// has reports whether the state after applied entries includes mark.
func (r *recording) has(mark string, applied int) bool {
	i, ok := r.marks[mark]
	return ok && i <= applied
}

// points chooses the replay points: every flush, FUA and mark from
// "ready" on, one point inside each run of plain writes between them,
// and the end of the log, sampled down to limit (marks are kept), and the
// number there were before sampling.
func (r *recording) points(limit int) ([]logwrites.Point, int) {
	ready := r.marks["ready"]
	var pts []logwrites.Point
	for _, p := range r.log.Points(1) {
		if p.Applied >= ready {
			pts = append(pts, p)
		}
	}
	// The end of the log (after the unmount) is a state too.
	if n := len(pts); n == 0 || pts[n-1].Applied != len(r.log.Entries) {
		pts = append(pts, logwrites.Point{Applied: len(r.log.Entries), Why: "end"})
	}
	return logwrites.Sample(pts, limit), len(pts)
}

// replay rebuilds the disk at each point, mounts a writable copy of it,
// so that the filesystem recovers its journal as after a reboot (a
// read-only mount without recovery would show a disk no machine ever
// sees), and calls check with the mount point. It returns the number of
// points whose disk did not mount; check is not called for those.
func (r *recording) replay(t *testing.T, pts []logwrites.Point, check func(p logwrites.Point, mnt string)) (unmountable int, details []string) {
	pristine := filepath.Join(r.dir, "replay.img")
	if err := copySparse(pristine, r.d.base); err != nil {
		t.Fatal(err)
	}
	pf, err := os.OpenFile(pristine, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	mnt := filepath.Join(r.dir, "replayed")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	applied := 0
	for _, p := range pts {
		if err := r.log.Replay(holeFile{pf}, applied, p.Applied); err != nil {
			t.Fatalf("replay to %d: %v", p.Applied, err)
		}
		applied = p.Applied
		if err := r.mounted(t, pristine, mnt, func() { check(p, mnt) }); err != nil {
			unmountable++
			if len(details) < 10 {
				details = append(details, fmt.Sprintf("%s point %d (%s, after mark %q): %v", r.d.fs, p.Applied, p.Why, p.Mark, err))
			}
		}
	}
	return unmountable, details
}

// mounted runs fn with a writable copy of img mounted at mnt.
func (r *recording) mounted(t *testing.T, img, mnt string, fn func()) error {
	cp := filepath.Join(r.dir, "mount.img")
	if err := copySparse(cp, img); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(cp)
	loop, err := tryAttachLoop(cp)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := loop.detach(); err != nil {
			t.Error(err)
		}
	}()
	if err := unix.Mount(loop.Path, mnt, r.d.fs, 0, fsOptions(r.d.fs)); err != nil {
		return fmt.Errorf("the replayed %s does not mount: %w", r.d.fs, err)
	}
	defer unmount(t, mnt)
	fn()
	return nil
}

func unmount(t testing.TB, dir string) {
	t.Helper()
	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatalf("unmount %s: %v", dir, err)
	}
}
