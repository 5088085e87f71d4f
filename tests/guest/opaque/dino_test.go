//go:build ovlkit_guest

package opaque

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// expectDinoIsStIno lists dir with getdents and checks that it holds
// exactly want (besides "." and "..") and that every entry's d_ino is the
// st_ino lstat gives for it: tools that find hard links or detect loops
// (find, du, tar) rely on both agreeing.
func expectDinoIsStIno(t *testing.T, dir string, want ...string) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	ds, err := getdents(fd, 32<<10, 0)
	unix.Close(fd)
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	// The ".." of a mount root is the directory it is mounted on, in
	// another filesystem: no st_ino of this overlay to compare with.
	var dirSt, parentSt unix.Stat_t
	if err := unix.Stat(dir, &dirSt); err != nil {
		t.Fatalf("stat %s: %v", dir, err)
	}
	if err := unix.Stat(filepath.Join(dir, ".."), &parentSt); err != nil {
		t.Fatalf("stat %s/..: %v", dir, err)
	}
	mountRoot := dirSt.Dev != parentSt.Dev
	var got []string
	for _, d := range ds {
		if d.name != "." && d.name != ".." {
			got = append(got, d.name)
		}
		if d.name == ".." && mountRoot {
			continue
		}
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, d.name), &st); err != nil {
			t.Errorf("lstat %s/%s listed by readdir: %v", dir, d.name, err)
			continue
		}
		if st.Ino != d.ino {
			t.Errorf("%s/%s: d_ino %d, st_ino %d", dir, d.name, d.ino, st.Ino)
		}
	}
	slices.Sort(got)
	want = slices.Clone(want)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("readdir %s = %q, want %q", dir, got, want)
	}
}

// expectXattrY checks that path carries xattr name with value "y": the
// layout a test relies on was really made.
func expectXattrY(t testing.TB, path, name string) {
	t.Helper()
	buf := make([]byte, 16)
	n, err := unix.Lgetxattr(path, name, buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Fatalf("%s on %s: %q, %v; want \"y\" (the test's layout was not made)", name, path, buf[:max(n, 0)], err)
	}
}

// impureOptions are the mount options under which mkdir in a merge
// directory makes an opaque directory (redirect_dir is not allowed with
// userxattr).
func impureOptions(ns xattrNS) []string {
	if ns.name == "user" {
		return []string{"index=on"}
	}
	return []string{"index=on", "redirect_dir=on"}
}

// Readdir of an upper directory that holds copied-up entries ("impure")
// reports their d_ino as the origin's inode number, which is what stat
// says; with xino=on every layer's inode numbers are mapped into one
// space, and readdir must map d_ino the same way. This holds for opaque
// directories (made by mkdir in a merge directory, or by the layer), pure
// upper directories, lower-only and merge directories alike, on the first
// mount and after a remount, when every directory is looked up afresh.
func TestImpureAndXinoDirReaddir(t *testing.T) {
	guesttest.Keeps(t, "readdir of impure and xino=on dirs lists the right names with d_ino equal to st_ino")
	forEachNS(t, func(t *testing.T, fs guesttest.FS, ns xattrNS) {
		for _, opt := range impureOptions(ns) {
			t.Run("impure-"+opt, func(t *testing.T) { testImpureReaddir(t, fs, ns, opt) })
		}
		t.Run("xino", func(t *testing.T) { testXinoReaddir(t, fs, ns) })
	})
}

func testImpureReaddir(t *testing.T, fs guesttest.FS, ns xattrNS, opt string) {
	l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
	guestfs.MkdirAll(t, filepath.Join(l.Lower[0], "m"))
	for _, n := range []string{"a", "b", "c", "d"} {
		guestfs.WriteFile(t, filepath.Join(l.Lower[0], "m", n), "lower "+n+"\n")
	}
	guestfs.MkdirAll(t, filepath.Join(l.Upper, "pure"))
	guestfs.WriteFile(t, filepath.Join(l.Upper, "pure", "mine"), "upper\n")
	opts := append([]string{opt}, ns.mount...)
	l.Mount(t, opts...)

	// mkdir in a merge directory makes an opaque directory; moving lower
	// files into it copies them up and makes it impure.
	guestfs.MkdirAll(t, merged(l, "m", "new"))
	expectXattrY(t, filepath.Join(l.Upper, "m", "new"), ns.opaque())
	guestfs.WriteFile(t, merged(l, "m", "new", "own"), "new\n")
	for _, mv := range [][2]string{{"m/a", "m/new/a"}, {"m/b", "m/new/b"}, {"m/c", "pure/c"}} {
		if err := os.Rename(merged(l, mv[0]), merged(l, mv[1])); err != nil {
			t.Fatalf("rename %s to %s: %v", mv[0], mv[1], err)
		}
	}
	// Copy-up in place makes the merge directory impure as well.
	if err := os.Chmod(merged(l, "m", "d"), 0o600); err != nil {
		t.Fatalf("chmod m/d (copy-up): %v", err)
	}
	for _, d := range []string{"m/new", "pure", "m"} {
		expectXattrY(t, filepath.Join(l.Upper, d), ns.name+".overlay.impure")
	}

	check := func(t *testing.T) {
		expectDinoIsStIno(t, merged(l, "m", "new"), "a", "b", "own")
		expectDinoIsStIno(t, merged(l, "pure"), "c", "mine")
		expectDinoIsStIno(t, merged(l, "m"), "d", "new")
	}
	t.Run("mounted", check)
	l.Unmount(t)
	l.Mount(t, opts...)
	t.Run("remounted", check)
}

func testXinoReaddir(t *testing.T, fs guesttest.FS, ns xattrNS) {
	l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
	// xino only maps inode numbers when the layers are on different
	// filesystems: the lower layer gets a tmpfs instance of its own.
	lowerFS := guesttest.FS{Name: "tmpfs"}
	l.Lower[0] = lowerFS.Scratch(t, "")
	lo := l.Lower[0]
	for _, d := range []string{"lo", "op", "mg"} {
		guestfs.MkdirAll(t, filepath.Join(lo, d))
	}
	guestfs.MkdirAll(t, filepath.Join(l.Upper, "up"))
	guestfs.MkdirAll(t, filepath.Join(l.Upper, "mg"))
	guestfs.WriteFile(t, filepath.Join(lo, "lo", "x"), "lower x\n")
	guestfs.WriteFile(t, filepath.Join(lo, "lo", "y"), "lower y\n")
	guestfs.WriteFile(t, filepath.Join(lo, "op", "secret"), "hidden\n")
	guestfs.WriteFile(t, filepath.Join(lo, "mg", "low"), "lower\n")
	fillDir(t, filepath.Join(l.Upper, "op"), 3)
	setXattr(t, filepath.Join(l.Upper, "op"), ns.opaque(), "y")
	guestfs.WriteFile(t, filepath.Join(l.Upper, "up", "mine"), "upper\n")
	guestfs.WriteFile(t, filepath.Join(l.Upper, "mg", "high"), "upper\n")
	opts := append([]string{"xino=on"}, ns.mount...)
	l.Mount(t, opts...)

	if err := os.Rename(merged(l, "lo", "x"), merged(l, "up", "x")); err != nil {
		t.Fatalf("rename lo/x to up/x: %v", err)
	}
	if err := os.Chmod(merged(l, "mg", "low"), 0o600); err != nil {
		t.Fatalf("chmod mg/low (copy-up): %v", err)
	}

	check := func(t *testing.T) {
		expectDinoIsStIno(t, merged(l, "lo"), "y")
		expectDinoIsStIno(t, merged(l, "op"), "entry-00000", "entry-00001", "entry-00002")
		expectDinoIsStIno(t, merged(l, "up"), "mine", "x")
		expectDinoIsStIno(t, merged(l, "mg"), "high", "low")
		expectDinoIsStIno(t, l.Merged, "lo", "mg", "op", "up")
	}
	t.Run("mounted", check)
	l.Unmount(t)
	l.Mount(t, opts...)
	t.Run("remounted", check)
}
