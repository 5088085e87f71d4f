//go:build ovlkit_guest

package copyup

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/ovl"
	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

var copyUpEvents = []string{"overlayfs/ovl_copy_up_start", "overlayfs/ovl_copy_up_end"}

// mountDev returns the device number of the mount at mountPoint as
// "major:minor", the way the overlayfs events print it.
func mountDev(t testing.TB, mountPoint string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatalf("read mountinfo: %v", err)
	}
	dev := ""
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && ovl.UnescapeMountField(f[4]) == mountPoint {
			dev = f[2]
		}
	}
	if dev == "" {
		t.Fatalf("%s is not in /proc/self/mountinfo", mountPoint)
	}
	return dev
}

// mountDevOf returns the device number, as "major:minor", of the
// superblock of the mount path is on: the deepest mount point above it.
func mountDevOf(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatalf("read mountinfo: %v", err)
	}
	dev, best := "", -1
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := ovl.UnescapeMountField(f[4])
		if (path == mp || strings.HasPrefix(path, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= best {
			dev, best = f[2], len(mp)
		}
	}
	if dev == "" {
		t.Fatalf("no mount above %s in /proc/self/mountinfo", path)
	}
	return dev
}

// copyUpPair returns the one start and one end event in evs and fails the
// test unless there is exactly one of each, for the overlay dev.
func copyUpPair(t testing.TB, evs []traceEvent, dev string) (start, end traceEvent) {
	t.Helper()
	starts, ends := named(evs, "ovl_copy_up_start"), named(evs, "ovl_copy_up_end")
	if len(starts) != 1 || len(ends) != 1 {
		t.Fatalf("got %d ovl_copy_up_start and %d ovl_copy_up_end events, want one of each: %v", len(starts), len(ends), evs)
	}
	start, end = starts[0], ends[0]
	for _, e := range []traceEvent{start, end} {
		if got := e.str(t, "dev"); got != dev {
			t.Errorf("%s is for device %s, the overlay is %s", e.Name, got, dev)
		}
	}
	if start.str(t, "ino") != end.str(t, "ino") {
		t.Errorf("start and end are for different inodes: %s / %s", start.Raw, end.Raw)
	}
	return start, end
}

// checkDataCopyUp checks an end event of a successful data copy up of
// size bytes: the byte counts add up and the method matches them.
func checkDataCopyUp(t testing.TB, end traceEvent, size uint64) {
	t.Helper()
	copied, cloned, holes := end.uint(t, "copied"), end.uint(t, "cloned"), end.uint(t, "holes")
	if copied+cloned+holes != size {
		t.Errorf("copied %d + cloned %d + holes %d != size %d: %s", copied, cloned, holes, size, end.Raw)
	}
	want := "splice"
	if cloned > 0 {
		want = "clone"
	}
	if m := end.str(t, "method"); m != want {
		t.Errorf("method=%s, want %s: %s", m, want, end.Raw)
	}
	if end.uint(t, "duration_ns") == 0 {
		t.Errorf("duration_ns is 0 for a copy up of %d bytes: %s", size, end.Raw)
	}
}

// TestTraceWriteOneFile writes one lower file and reads another through
// the overlay on every upper filesystem: the write gives exactly one copy
// up event pair with the file's size, the read none.
func TestTraceWriteOneFile(t *testing.T) {
	guesttest.Proves(t, subjectTrace)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		const size = 3 << 20
		l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
		writeFile(t, filepath.Join(l.Lower[0], "w"), size, 0o644)
		writeFile(t, filepath.Join(l.Lower[0], "r"), size, 0o644)
		l.Mount(t)
		dev := mountDev(t, l.Merged)
		tr := newTrace(t, copyUpEvents...)

		tr.clear(t)
		if got := guestfs.ReadFile(t, filepath.Join(l.Merged, "r")); len(got) != size {
			t.Fatalf("read %d bytes, want %d", len(got), size)
		}
		if evs := tr.events(t); len(evs) != 0 {
			t.Errorf("reading a lower file traced copy up events: %v", evs)
		}

		tr.clear(t)
		openForWrite(t, filepath.Join(l.Merged, "w"))
		start, end := copyUpPair(t, tr.events(t), dev)
		t.Logf("events:\n%s\n%s", start.Raw, end.Raw)
		merged := guestfs.Lstat(t, filepath.Join(l.Merged, "w"))
		lower := guestfs.Lstat(t, filepath.Join(l.Lower[0], "w"))
		upper := guestfs.Lstat(t, filepath.Join(l.Upper, "w"))
		if got := start.uint(t, "ino"); got != merged.Ino {
			t.Errorf("start ino=%d, the overlay inode is %d", got, merged.Ino)
		}
		if got := start.uint(t, "lower_ino"); got != lower.Ino {
			t.Errorf("start lower_ino=%d, the lower inode is %d", got, lower.Ino)
		}
		if got := end.uint(t, "upper_ino"); got != upper.Ino {
			t.Errorf("end upper_ino=%d, the upper inode is %d", got, upper.Ino)
		}
		for _, e := range []traceEvent{start, end} {
			if e.str(t, "ftype") != "reg" || e.str(t, "kind") != "full" || e.uint(t, "size") != size {
				t.Errorf("want ftype=reg kind=full size=%d: %s", size, e.Raw)
			}
		}
		if e := end.int(t, "err"); e != 0 {
			t.Errorf("copy up failed with %d: %s", e, end.Raw)
		}
		checkDataCopyUp(t, end, size)
		sameContent(t, filepath.Join(l.Lower[0], "w"), filepath.Join(l.Upper, "w"))
	})
}

// TestTraceMetacopy checks the kind of copy up under metacopy=on: a chmod
// copies up metadata only, a later write copies the data.
func TestTraceMetacopy(t *testing.T) {
	guesttest.Proves(t, subjectTrace)
	ext4 := guesttest.NeedFS(t, "ext4")
	const size = 1 << 20
	l := splitLayers(t, ext4)
	writeFile(t, filepath.Join(l.Lower[0], "f"), size, 0o644)
	l.Mount(t, "metacopy=on")
	dev := mountDev(t, l.Merged)
	tr := newTrace(t, copyUpEvents...)

	tr.clear(t)
	if err := os.Chmod(filepath.Join(l.Merged, "f"), 0o600); err != nil {
		t.Fatalf("chmod: %v", err)
	}
	start, end := copyUpPair(t, tr.events(t), dev)
	for _, e := range []traceEvent{start, end} {
		if e.str(t, "kind") != "meta" || e.uint(t, "size") != size {
			t.Errorf("chmod under metacopy=on: want kind=meta size=%d: %s", size, e.Raw)
		}
	}
	if end.uint(t, "copied")+end.uint(t, "cloned") != 0 || end.str(t, "method") != "none" || end.int(t, "err") != 0 {
		t.Errorf("metadata-only copy up moved data or failed: %s", end.Raw)
	}

	tr.clear(t)
	openForWrite(t, filepath.Join(l.Merged, "f"))
	start, end = copyUpPair(t, tr.events(t), dev)
	if start.str(t, "kind") != "data" || end.str(t, "kind") != "data" || end.int(t, "err") != 0 {
		t.Errorf("write after a metadata-only copy up: want kind=data: %s / %s", start.Raw, end.Raw)
	}
	checkDataCopyUp(t, end, size)
}

// TestTraceCopyUpError fills a small tmpfs upper: the end event carries the
// error the copy up failed with.
func TestTraceCopyUpError(t *testing.T) {
	guesttest.Proves(t, subjectTrace)
	tmpfs := guesttest.FS{Name: "tmpfs"}
	l := guesttest.NewLayers(t, tmpfs.Scratch(t, "size=1m"), 1)
	l.Lower[0] = filepath.Join(tmpfs.Scratch(t, ""), "lower")
	guestfs.Mkdir(t, l.Lower[0], 0o755)
	writeFile(t, filepath.Join(l.Lower[0], "big"), 3<<20, 0o644)
	l.Mount(t)
	tr := newTrace(t, copyUpEvents...)

	tr.clear(t)
	_, err := os.OpenFile(filepath.Join(l.Merged, "big"), os.O_WRONLY, 0)
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("open for write on a full upper: got %v, want ENOSPC", err)
	}
	_, end := copyUpPair(t, tr.events(t), mountDev(t, l.Merged))
	if e := end.int(t, "err"); e != -int64(unix.ENOSPC) {
		t.Errorf("end err=%d, want %d: %s", e, -int64(unix.ENOSPC), end.Raw)
	}
	if end.uint(t, "upper_ino") != 0 {
		t.Errorf("failed copy up reports an upper inode: %s", end.Raw)
	}
}

// TestTraceUpperFeatures checks the report of the mount-time probes: every
// scratch filesystem supports all of them, and an overlay without upper
// layer probes nothing.
func TestTraceUpperFeatures(t *testing.T) {
	guesttest.Proves(t, subjectTrace)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		base := fs.Scratch(t, "")
		l := guesttest.NewLayers(t, base, 1)
		tr := newTrace(t, "overlayfs/ovl_upper_features")
		tr.clear(t)
		l.Mount(t)
		evs := named(tr.events(t), "ovl_upper_features")
		if len(evs) != 1 {
			t.Fatalf("got %d ovl_upper_features events for one mount, want 1: %v", len(evs), evs)
		}
		e := evs[0]
		if got := e.str(t, "dev"); got != mountDev(t, l.Merged) {
			t.Errorf("event is for device %s, the overlay is %s", got, mountDev(t, l.Merged))
		}
		// Not st_dev of the upper dir: btrfs reports a per-subvolume one.
		if got, want := e.str(t, "upper_dev"), mountDevOf(t, l.Upper); got != want {
			t.Errorf("upper_dev=%s, the upper directory is on %s", got, want)
		}
		if got := e.str(t, "upper_fs"); got != fs.Name {
			t.Errorf("upper_fs=%s, want %s", got, fs.Name)
		}
		for _, k := range []string{"d_type", "xattr", "tmpfile", "rename_whiteout"} {
			if v := e.uint(t, k); v != 1 {
				t.Errorf("%s=%d on %s, which supports it: %s", k, v, fs.Name, e.Raw)
			}
		}

		tr.clear(t)
		ro := filepath.Join(base, "ro")
		guestfs.Mkdir(t, ro, 0o755)
		// Without upper layer overlayfs needs two lower layers.
		second := filepath.Join(base, "second")
		guestfs.Mkdir(t, second, 0o755)
		if err := guesttest.TryMountAt(t, ro, "lowerdir="+l.Lower[0]+":"+second); err != nil {
			t.Fatalf("mount lower-only overlay: %v", err)
		}
		if evs := named(tr.events(t), "ovl_upper_features"); len(evs) != 0 {
			t.Errorf("a mount without upper layer reported upper features: %v", evs)
		}
	})
}

// TestTraceFeaturesMissing mounts an overlay on a ramfs upper, which in
// 6.1 has neither xattrs nor RENAME_WHITEOUT: the report must say so
// rather than always printing 1.
func TestTraceFeaturesMissing(t *testing.T) {
	guesttest.Proves(t, subjectTrace)
	dir, err := os.MkdirTemp("/mnt", "ramfs-")
	if err != nil {
		t.Fatalf("mkdtemp: %v", err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	if err := unix.Mount("ramfs", dir, "ramfs", 0, ""); err != nil {
		t.Fatalf("mount ramfs: %v", err)
	}
	t.Cleanup(func() {
		guesttest.UnmountBeneath(t, dir)
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount ramfs: %v", err)
		}
	})
	l := guesttest.NewLayers(t, dir, 1)
	tr := newTrace(t, "overlayfs/ovl_upper_features")
	tr.clear(t)
	l.Mount(t)
	evs := named(tr.events(t), "ovl_upper_features")
	if len(evs) != 1 {
		t.Fatalf("got %d ovl_upper_features events, want 1: %v", len(evs), evs)
	}
	e := evs[0]
	want := map[string]uint64{"d_type": 1, "xattr": 0, "tmpfile": 1, "rename_whiteout": 0}
	for k, v := range want {
		if got := e.uint(t, k); got != v {
			t.Errorf("ramfs upper: %s=%d, want %d: %s", k, got, v, e.Raw)
		}
	}
	if got := e.str(t, "upper_fs"); got != "ramfs" {
		t.Errorf("upper_fs=%s, want ramfs", got)
	}
}
