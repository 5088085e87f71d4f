//go:build ovlkit_guest

package opaque

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// seekEntries is the size of the directories whose offsets are compared:
// enough for many getdents calls and, on ext4, a hashed (htree) directory.
const seekEntries = 300

// seekBuf is the getdents buffer of the offset tests, a dozen entries: the
// position after the first half is then one the filesystem chose, not the
// end of the directory.
const seekBuf = 512

// seekWalk is one pass of telldir/seekdir over a directory.
type seekWalk struct {
	first []dirent // about the first half of the entries
	mid   int64    // lseek(fd, 0, SEEK_CUR) after first
	rest  []dirent // everything after mid
	again []dirent // read again after lseek(fd, mid, SEEK_SET)
}

// walkSeek reads half of dir, remembers the position, reads the rest,
// seeks back and reads the rest again, as a tree walker that resumes with
// telldir/seekdir does.
func walkSeek(t testing.TB, dir string, half int) seekWalk {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	defer unix.Close(fd)
	var w seekWalk
	if w.first, err = getdents(fd, seekBuf, half); err != nil {
		t.Fatalf("read first half of %s: %v", dir, err)
	}
	if w.mid, err = unix.Seek(fd, 0, unix.SEEK_CUR); err != nil {
		t.Fatalf("lseek(SEEK_CUR) in %s: %v", dir, err)
	}
	if w.rest, err = getdents(fd, seekBuf, 0); err != nil {
		t.Fatalf("read rest of %s: %v", dir, err)
	}
	pos, err := unix.Seek(fd, w.mid, unix.SEEK_SET)
	if err != nil || pos != w.mid {
		t.Fatalf("lseek(%d, SEEK_SET) in %s = %d, %v", w.mid, dir, pos, err)
	}
	if w.again, err = getdents(fd, seekBuf, 0); err != nil {
		t.Fatalf("read %s again after seekdir: %v", dir, err)
	}
	return w
}

// sameNamesAndOffsets reports the first entry where a and b differ in name
// or d_off, or "" when they are equal.
func sameNamesAndOffsets(a, b []dirent) string {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i].name != b[i].name || a[i].off != b[i].off {
			return fmt.Sprintf("entry %d: %q at d_off %d, want %q at d_off %d",
				i, a[i].name, a[i].off, b[i].name, b[i].off)
		}
	}
	if len(a) != len(b) {
		return fmt.Sprintf("%d entries, want %d", len(a), len(b))
	}
	return ""
}

// expectSeekLikeReal checks that lseek and getdents offsets on the overlay
// directory ovlDir are those of the real directory realDir it is read
// from, which programs store (telldir, NFS cookies, rsync) and hand back.
func expectSeekLikeReal(t *testing.T, ovlDir, realDir string, entries int) {
	t.Helper()
	if got, want := seekEnd(t, ovlDir), seekEnd(t, realDir); got != want {
		t.Errorf("lseek(0, SEEK_END) on the overlay dir: %s; on the real dir: %s", got, want)
	}
	half := (entries + 2) / 2 // with "." and ".."
	ovl, real := walkSeek(t, ovlDir, half), walkSeek(t, realDir, half)
	if ovl.mid != real.mid {
		t.Errorf("telldir after %d entries: %d on the overlay dir, %d on the real dir",
			len(ovl.first), ovl.mid, real.mid)
	}
	if d := sameNamesAndOffsets(ovl.first, real.first); d != "" {
		t.Errorf("first half, overlay vs real dir: %s", d)
	}
	if d := sameNamesAndOffsets(ovl.rest, real.rest); d != "" {
		t.Errorf("second half, overlay vs real dir: %s", d)
	}
	if got, want := direntNames(ovl.again), direntNames(ovl.rest); !slices.Equal(got, want) {
		t.Errorf("after seekdir(%d) the overlay dir lists %d names (%.5q...), before it %d (%.5q...)",
			ovl.mid, len(got), got, len(want), want)
	}
	if n := len(ovl.first) + len(ovl.rest); n != entries+2 {
		t.Errorf("overlay dir lists %d entries, want %d and . and ..", n, entries)
	}
}

// fillDir creates n empty files in dir.
func fillDir(t testing.TB, dir string, n int) {
	t.Helper()
	guestfs.MkdirAll(t, dir)
	for i := 0; i < n; i++ {
		guestfs.WriteFile(t, filepath.Join(dir, fmt.Sprintf("entry-%05d", i)), "")
	}
}

// Opaque directories are read straight from the real directory, so lseek
// is the real filesystem's: SEEK_END works where that filesystem supports
// it, and telldir/seekdir positions are its own offsets. An opaque
// directory (hiding a lower one) must behave exactly like an upper
// directory without the xattr.
func TestOpaqueDirLlseek(t *testing.T) {
	guesttest.Keeps(t, "lseek and telldir/seekdir on an opaque dir are those of the real dir")
	forEachNS(t, func(t *testing.T, fs guesttest.FS, ns xattrNS) {
		l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
		guestfs.MkdirAll(t, filepath.Join(l.Lower[0], "opaque"))
		guestfs.WriteFile(t, filepath.Join(l.Lower[0], "opaque", "secret"), "hidden\n")
		fillDir(t, filepath.Join(l.Upper, "opaque"), seekEntries)
		setXattr(t, filepath.Join(l.Upper, "opaque"), ns.opaque(), "y")
		fillDir(t, filepath.Join(l.Upper, "plain"), seekEntries)
		l.Mount(t, ns.mount...)
		for _, dir := range []string{"opaque", "plain"} {
			t.Run(dir, func(t *testing.T) {
				expectSeekLikeReal(t, merged(l, dir), filepath.Join(l.Upper, dir), seekEntries)
			})
		}
	})
}
