//go:build ovlkit_guest

package copyup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// subjectStats is the subject of the patch that adds the copy-up counters,
// exactly as in patches/6.1.
const subjectStats = "ovl: report copy-up statistics in sysfs"

// statKeys are the counters of a mount, one file each in
// /sys/fs/overlay/<major>:<minor>/copy_up.
var statKeys = []string{
	"reg", "dir", "lnk", "spec", "meta", "data", "link",
	"copied_bytes", "cloned_bytes", "hole_bytes", "fsync",
	"fail_enospc", "fail_eintr", "fail_other",
}

// statsDir returns the sysfs directory of the counters of the overlay
// mounted at mountPoint, named after its device number.
func statsDir(t testing.TB, mountPoint string) string {
	t.Helper()
	info := guesttest.OverlayEntry(t, mountPoint)
	return fmt.Sprintf("/sys/fs/overlay/%d:%d/copy_up", info.Major, info.Minor)
}

// readCounters reads every counter file of dir, which must hold exactly
// the documented counters.
func readCounters(dir string) (map[string]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list copy-up counters: %w", err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	want := slices.Clone(statKeys)
	slices.Sort(want)
	slices.Sort(names)
	if !slices.Equal(names, want) {
		return nil, fmt.Errorf("%s holds %v, want the counters %v", dir, names, want)
	}
	out := map[string]uint64{}
	for _, k := range statKeys {
		b, err := os.ReadFile(filepath.Join(dir, k))
		if err != nil {
			return nil, fmt.Errorf("read counter: %w", err)
		}
		// One decimal value and a newline, as sysfs attributes print.
		v, err := strconv.ParseUint(strings.TrimSuffix(string(b), "\n"), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("counter %s/%s holds %q: %w", dir, k, b, err)
		}
		out[k] = v
	}
	return out, nil
}

// copyUpStats returns the counters of the overlay mounted at mountPoint.
func copyUpStats(t testing.TB, mountPoint string) map[string]uint64 {
	t.Helper()
	c, err := readCounters(statsDir(t, mountPoint))
	if err != nil {
		t.Fatalf("copy-up counters of %s: %v", mountPoint, err)
	}
	return c
}

// expectStats compares every counter with want, where missing keys of want
// mean zero.
func expectStats(t testing.TB, got, want map[string]uint64) {
	t.Helper()
	for _, k := range statKeys {
		if got[k] != want[k] {
			t.Errorf("%s=%d, want %d (all: %v)", k, got[k], want[k], got)
		}
	}
}

// sparseFile makes a 4 MiB file with data in [0, 1 MiB) and [2 MiB, 3 MiB)
// and holes elsewhere. Its extents are aligned to the copy-up chunk size,
// so which bytes copy up copies and skips does not depend on chunking.
func sparseFile(t testing.TB, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatalf("create %s: %v", path, err)
	}
	defer f.Close()
	for _, off := range []int64{0, 2 << 20} {
		if _, err := f.WriteAt(pattern(1<<20), off); err != nil {
			t.Fatalf("write %s: %v", path, err)
		}
	}
	if err := f.Truncate(4 << 20); err != nil {
		t.Fatalf("truncate %s: %v", path, err)
	}
}

// TestStatsScript runs a fixed sequence of copy ups on a 3 MiB tmpfs
// upper and checks that the counters say exactly what happened.
func TestStatsScript(t *testing.T) {
	guesttest.Proves(t, subjectStats)
	tmpfs := guesttest.FS{Name: "tmpfs"}
	l := guesttest.NewLayers(t, tmpfs.Scratch(t, "size=3m"), 1)
	l.Lower[0] = filepath.Join(tmpfs.Scratch(t, ""), "lower")
	guestfs.Mkdir(t, l.Lower[0], 0o755)
	lower := l.Lower[0]
	writeFile(t, filepath.Join(lower, "f"), 64<<10, 0o644)
	guestfs.Mkdir(t, filepath.Join(lower, "d"), 0o755)
	sparseFile(t, filepath.Join(lower, "sparse"))
	writeFile(t, filepath.Join(lower, "big"), 4<<20, 0o644)
	writeFile(t, filepath.Join(lower, "read"), 64<<10, 0o644)
	l.Mount(t)

	expectStats(t, copyUpStats(t, l.Merged), nil)

	guestfs.ReadFile(t, filepath.Join(l.Merged, "read"))
	openForWrite(t, filepath.Join(l.Merged, "f"))
	expectStats(t, copyUpStats(t, l.Merged), map[string]uint64{
		"reg": 1, "copied_bytes": 64 << 10, "fsync": 1,
	})

	writeFile(t, filepath.Join(l.Merged, "d", "new"), 10, 0o644)
	openForWrite(t, filepath.Join(l.Merged, "sparse"))
	expectStats(t, copyUpStats(t, l.Merged), map[string]uint64{
		"reg": 2, "dir": 1, "copied_bytes": 64<<10 + 2<<20, "hole_bytes": 2 << 20, "fsync": 2,
	})
	sameContent(t, filepath.Join(lower, "sparse"), filepath.Join(l.Upper, "sparse"))

	_, err := os.OpenFile(filepath.Join(l.Merged, "big"), os.O_WRONLY, 0)
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("open for write of 4 MiB on a 3 MiB upper: got %v, want ENOSPC", err)
	}
	expectStats(t, copyUpStats(t, l.Merged), map[string]uint64{
		"reg": 2, "dir": 1, "copied_bytes": 64<<10 + 2<<20, "hole_bytes": 2 << 20, "fsync": 2,
		"fail_enospc": 1,
	})

	// The counters belong to the mount: a second overlay starts at zero.
	l2 := guesttest.NewLayers(t, tmpfs.Scratch(t, ""), 1)
	l2.Mount(t)
	expectStats(t, copyUpStats(t, l2.Merged), nil)
}

// TestStatsStrictAndMetacopy counts the fsyncs of fsync=strict (one
// per copied up inode; two for the data copy up of a metacopy file, whose
// data is synced before its metacopy xattr goes and again after) and the
// two halves of a metacopy=on copy up.
func TestStatsStrictAndMetacopy(t *testing.T) {
	guesttest.Proves(t, subjectStats)
	ext4 := guesttest.NeedFS(t, "ext4")
	l := splitLayers(t, ext4)
	lower := l.Lower[0]
	guestfs.Mkdir(t, filepath.Join(lower, "d"), 0o755)
	writeFile(t, filepath.Join(lower, "d", "f"), 128<<10, 0o644)
	if err := os.Symlink("d/f", filepath.Join(lower, "s")); err != nil {
		t.Fatalf("symlink: %v", err)
	}
	if err := unix.Mkfifo(filepath.Join(lower, "p"), 0o644); err != nil {
		t.Fatalf("mkfifo: %v", err)
	}
	l.Mount(t, "fsync=strict", "metacopy=on")

	// chmod copies up d (a directory) and then f without data.
	if err := os.Chmod(filepath.Join(l.Merged, "d", "f"), 0o600); err != nil {
		t.Fatalf("chmod: %v", err)
	}
	expectStats(t, copyUpStats(t, l.Merged), map[string]uint64{"dir": 1, "meta": 1, "fsync": 2})

	openForWrite(t, filepath.Join(l.Merged, "d", "f"))
	expectStats(t, copyUpStats(t, l.Merged), map[string]uint64{
		"dir": 1, "meta": 1, "data": 1, "copied_bytes": 128 << 10, "fsync": 4,
	})

	// Symlinks and fifos are copied up whole; strict syncs neither.
	for _, name := range []string{"s", "p"} {
		if err := os.Lchown(filepath.Join(l.Merged, name), 1, 1); err != nil {
			t.Fatalf("chown %s: %v", name, err)
		}
	}
	expectStats(t, copyUpStats(t, l.Merged), map[string]uint64{
		"dir": 1, "meta": 1, "data": 1, "lnk": 1, "spec": 1, "copied_bytes": 128 << 10, "fsync": 4,
	})
}

// TestStatsCloned copies up between two directories of one btrfs,
// which clones the data instead of copying it.
func TestStatsCloned(t *testing.T) {
	guesttest.Proves(t, subjectStats)
	btrfs := guesttest.NeedFS(t, "btrfs")
	l := guesttest.NewLayers(t, btrfs.Scratch(t, ""), 1)
	writeFile(t, filepath.Join(l.Lower[0], "f"), 1<<20, 0o644)
	l.Mount(t)
	openForWrite(t, filepath.Join(l.Merged, "f"))
	expectStats(t, copyUpStats(t, l.Merged), map[string]uint64{
		"reg": 1, "cloned_bytes": 1 << 20, "fsync": 0,
	})
	sameContent(t, filepath.Join(l.Lower[0], "f"), filepath.Join(l.Upper, "f"))
}

// TestStatsSysfsLifecycle checks where the counters live: a directory named
// after the overlay's device number that appears at mount and disappears
// at unmount, while the overlay's line in /proc/self/mountstats stays the
// stock one, which prometheus/procfs (node_exporter) can parse.
func TestStatsSysfsLifecycle(t *testing.T) {
	guesttest.Proves(t, subjectStats)
	tmpfs := guesttest.FS{Name: "tmpfs"}
	l := guesttest.NewLayers(t, tmpfs.Scratch(t, ""), 1)
	writeFile(t, filepath.Join(l.Lower[0], "f"), 4<<10, 0o644)
	l.Mount(t)

	// The directory is named after st_dev of the overlay.
	info := guesttest.OverlayEntry(t, l.Merged)
	st := guestfs.Lstat(t, l.Merged)
	if uint32(info.Major) != unix.Major(st.Dev) || uint32(info.Minor) != unix.Minor(st.Dev) {
		t.Fatalf("mountinfo says %d:%d for %s, stat says %s", info.Major, info.Minor, l.Merged, devString(st.Dev))
	}
	dir := statsDir(t, l.Merged)
	expectStats(t, copyUpStats(t, l.Merged), nil)
	openForWrite(t, filepath.Join(l.Merged, "f"))
	expectStats(t, copyUpStats(t, l.Merged), map[string]uint64{"reg": 1, "copied_bytes": 4 << 10, "fsync": 1})

	mounts := guesttest.ProcfsMountStats(t)
	var line *procfs.Mount
	for _, m := range mounts {
		if m.Mount == l.Merged {
			line = m
		}
	}
	switch {
	case line == nil:
		t.Errorf("procfs lists no mount on %s in /proc/self/mountstats", l.Merged)
	case line.Type != "overlay" || line.Stats != nil:
		// procfs fills Stats only from fields after "with fstype TYPE".
		t.Errorf("mountstats line of %s: fstype %q, statistics %#v; want overlay and nothing after it", l.Merged, line.Type, line.Stats)
	}

	l.Unmount(t)
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after unmount: got %v, want it gone", dir, err)
	}
	if _, err := os.Lstat(filepath.Dir(dir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after unmount: got %v, want it gone", filepath.Dir(dir), err)
	}
}
