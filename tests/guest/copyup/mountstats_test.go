//go:build ovlkit_guest

package copyup

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/ovl"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// statKeys are the counters the overlay line of mountstats carries after
// "statvers=1", in their documented order.
var statKeys = []string{
	"reg", "dir", "lnk", "spec", "meta", "data", "link",
	"copied_bytes", "cloned_bytes", "hole_bytes", "fsync",
	"fail_enospc", "fail_eintr", "fail_other",
}

// copyUpStats returns the counters of the overlay mounted at mountPoint.
func copyUpStats(t testing.TB, mountPoint string) map[string]uint64 {
	t.Helper()
	ms, ok, err := ovl.MountStatsFor(mountPoint)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("%s is not in /proc/self/mountstats", mountPoint)
	}
	if ms.FSType != "overlay" || !ms.HasStats() {
		t.Fatalf("mountstats line of %s has no overlay statistics: %+v", mountPoint, ms)
	}
	if ms.StatVers != "1" {
		t.Fatalf("mountstats line of %s has statvers=%q, want 1: %q", mountPoint, ms.StatVers, ms.Raw)
	}
	for _, k := range statKeys {
		if _, ok := ms.Counters[k]; !ok {
			t.Fatalf("mountstats line of %s has no %q: %q", mountPoint, k, ms.Raw)
		}
	}
	if len(ms.Counters) != len(statKeys) {
		t.Errorf("mountstats line of %s has %d counters, want the %d documented: %q", mountPoint, len(ms.Counters), len(statKeys), ms.Raw)
	}
	return ms.Counters
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

// TestMountstatsScript runs a fixed sequence of copy ups on a 3 MiB tmpfs
// upper and checks that the counters say exactly what happened.
func TestMountstatsScript(t *testing.T) {
	guesttest.Proves(t, subjectMountstats)
	tmpfs := guesttest.FS{Name: "tmpfs"}
	l := guesttest.NewLayers(t, tmpfs.Scratch(t, "size=3m"), 1)
	l.Lower[0] = filepath.Join(tmpfs.Scratch(t, ""), "lower")
	mkdir(t, l.Lower[0], 0o755)
	lower := l.Lower[0]
	writeFile(t, filepath.Join(lower, "f"), 64<<10, 0o644)
	mkdir(t, filepath.Join(lower, "d"), 0o755)
	sparseFile(t, filepath.Join(lower, "sparse"))
	writeFile(t, filepath.Join(lower, "big"), 4<<20, 0o644)
	writeFile(t, filepath.Join(lower, "read"), 64<<10, 0o644)
	l.Mount(t)

	expectStats(t, copyUpStats(t, l.Merged), nil)

	readAll(t, filepath.Join(l.Merged, "read"))
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

// TestMountstatsStrictAndMetacopy counts the fsyncs of fsync=strict (one
// per copied up inode, none for data alone) and the two halves of a
// metacopy=on copy up.
func TestMountstatsStrictAndMetacopy(t *testing.T) {
	guesttest.Proves(t, subjectMountstats)
	ext4 := needFS(t, "ext4")
	l := splitLayers(t, ext4)
	lower := l.Lower[0]
	mkdir(t, filepath.Join(lower, "d"), 0o755)
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
		"dir": 1, "meta": 1, "data": 1, "copied_bytes": 128 << 10, "fsync": 3,
	})

	// Symlinks and fifos are copied up whole; strict syncs neither.
	for _, name := range []string{"s", "p"} {
		if err := os.Lchown(filepath.Join(l.Merged, name), 1, 1); err != nil {
			t.Fatalf("chown %s: %v", name, err)
		}
	}
	expectStats(t, copyUpStats(t, l.Merged), map[string]uint64{
		"dir": 1, "meta": 1, "data": 1, "lnk": 1, "spec": 1, "copied_bytes": 128 << 10, "fsync": 3,
	})
}

// TestMountstatsCloned copies up between two directories of one btrfs,
// which clones the data instead of copying it.
func TestMountstatsCloned(t *testing.T) {
	guesttest.Proves(t, subjectMountstats)
	btrfs := needFS(t, "btrfs")
	l := guesttest.NewLayers(t, btrfs.Scratch(t, ""), 1)
	writeFile(t, filepath.Join(l.Lower[0], "f"), 1<<20, 0o644)
	l.Mount(t)
	openForWrite(t, filepath.Join(l.Merged, "f"))
	expectStats(t, copyUpStats(t, l.Merged), map[string]uint64{
		"reg": 1, "cloned_bytes": 1 << 20, "fsync": 0,
	})
	sameContent(t, filepath.Join(l.Lower[0], "f"), filepath.Join(l.Upper, "f"))
}
