//go:build ovlkit_guest

package opaque

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// strayLayers builds the layout layer tools leave behind: an upper
// directory d marked opaque that still holds a whiteout "ghost" next to a
// real file "keep". With withLower, lower0/d exists too and holds "ghost"
// and "secret", which the opaque upper directory must both hide; without
// it, no lower layer has d at all, which is the case where rmdir used to
// fail with ENOTEMPTY.
func strayLayers(t *testing.T, fs guesttest.FS, ns xattrNS, withLower bool) guesttest.Layers {
	t.Helper()
	l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
	guestfs.WriteFile(t, filepath.Join(l.Lower[0], "top"), "lower top\n")
	if withLower {
		guestfs.MkdirAll(t, filepath.Join(l.Lower[0], "d"))
		guestfs.WriteFile(t, filepath.Join(l.Lower[0], "d", "ghost"), "deleted\n")
		guestfs.WriteFile(t, filepath.Join(l.Lower[0], "d", "secret"), "hidden by opaque\n")
	}
	d := filepath.Join(l.Upper, "d")
	guestfs.MkdirAll(t, d)
	setXattr(t, d, ns.opaque(), "y")
	whiteout(t, filepath.Join(d, "ghost"))
	guestfs.WriteFile(t, filepath.Join(d, "keep"), "upper\n")
	l.Mount(t, ns.mount...)
	return l
}

// lowerCases runs fn for an opaque directory with and without a
// directory of the same name in the lower layer.
func lowerCases(t *testing.T, fn func(t *testing.T, withLower bool)) {
	t.Helper()
	t.Run("no-lower-dir", func(t *testing.T) { fn(t, false) })
	t.Run("lower-dir", func(t *testing.T) { fn(t, true) })
}

// A whiteout in an opaque directory has nothing to hide, so it must not
// be listed either: readdir showing a name that lstat says does not exist
// breaks every tree walker.
func TestStrayWhiteoutNotListed(t *testing.T) {
	guesttest.Proves(t, subjectHideWhiteouts)
	forEachNS(t, func(t *testing.T, fs guesttest.FS, ns xattrNS) {
		lowerCases(t, func(t *testing.T, withLower bool) {
			l := strayLayers(t, fs, ns, withLower)
			expectNames(t, merged(l, "d"), "keep")
			expectENOENT(t, merged(l, "d", "ghost"))
			expectENOENT(t, merged(l, "d", "secret"))
			// Reading again goes through the cached list: same answer.
			expectNames(t, merged(l, "d"), "keep")
		})
	})
}

// With no lower directory, the opaque directory is "pure upper" to
// overlayfs, which used to hand rmdir straight to the upper filesystem:
// the stray whiteout made it ENOTEMPTY although the merged directory
// looked empty.
func TestStrayWhiteoutRmdirNoLowerDir(t *testing.T) {
	guesttest.Proves(t, subjectHideWhiteouts)
	forEachNS(t, func(t *testing.T, fs guesttest.FS, ns xattrNS) {
		l := strayLayers(t, fs, ns, false)
		if err := os.Remove(merged(l, "d", "keep")); err != nil {
			t.Fatalf("unlink keep: %v", err)
		}
		if err := os.Remove(merged(l, "d")); err != nil {
			t.Fatalf("rmdir of an opaque dir holding only a stray whiteout: %v", err)
		}
		expectENOENT(t, merged(l, "d"))
		// Nothing below to hide, so nothing may be left in upper.
		expectENOENT(t, filepath.Join(l.Upper, "d"))
		expectNames(t, l.Merged, "top")
	})
}

// When a lower layer has the directory, rmdir already took the merged
// path on stock kernels; it must keep working and leave a whiteout for d.
func TestStrayWhiteoutRmdirWithLowerDir(t *testing.T) {
	guesttest.Keeps(t, "rmdir of an opaque dir with stray whiteouts and a lower dir works")
	forEachNS(t, func(t *testing.T, fs guesttest.FS, ns xattrNS) {
		l := strayLayers(t, fs, ns, true)
		if err := os.Remove(merged(l, "d", "keep")); err != nil {
			t.Fatalf("unlink keep: %v", err)
		}
		if err := os.Remove(merged(l, "d")); err != nil {
			t.Fatalf("rmdir: %v", err)
		}
		expectENOENT(t, merged(l, "d"))
		if !isWhiteout(t, filepath.Join(l.Upper, "d")) {
			t.Errorf("upper/d is not a whiteout after rmdir of a dir that lower0 has")
		}
		expectNames(t, l.Merged, "top")
	})
}

// rename(2) of a directory over an empty-looking opaque directory must
// replace it, as it would replace any empty directory.
func TestStrayWhiteoutRenameOver(t *testing.T) {
	guesttest.Proves(t, subjectHideWhiteouts)
	forEachNS(t, func(t *testing.T, fs guesttest.FS, ns xattrNS) {
		lowerCases(t, func(t *testing.T, withLower bool) {
			l := strayLayers(t, fs, ns, withLower)
			if err := os.Remove(merged(l, "d", "keep")); err != nil {
				t.Fatalf("unlink keep: %v", err)
			}
			src := merged(l, "src")
			guestfs.MkdirAll(t, src)
			guestfs.WriteFile(t, filepath.Join(src, "moved"), "new\n")
			// os.Rename refuses to replace a directory by itself, so
			// call rename(2) directly.
			if err := unix.Rename(src, merged(l, "d")); err != nil {
				t.Fatalf("rename dir over an opaque dir holding only a stray whiteout: %v", err)
			}
			expectENOENT(t, src)
			// The lower d (when there is one) must stay hidden.
			expectNames(t, merged(l, "d"), "moved")
			expectNames(t, l.Merged, "d", "top")
		})
	})
}

// Regression: in an ordinary merge directory, whiteouts (pre-made and
// made by unlink) still hide the lower entries and are never listed.
func TestMergeDirWhiteoutsHideLower(t *testing.T) {
	guesttest.Keeps(t, "whiteouts in a merge dir hide the lower entries")
	forEachNS(t, func(t *testing.T, fs guesttest.FS, ns xattrNS) {
		l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
		ld := filepath.Join(l.Lower[0], "d")
		guestfs.MkdirAll(t, ld)
		for _, n := range []string{"a", "b", "c"} {
			guestfs.WriteFile(t, filepath.Join(ld, n), "lower "+n+"\n")
		}
		ud := filepath.Join(l.Upper, "d")
		guestfs.MkdirAll(t, ud)
		whiteout(t, filepath.Join(ud, "b"))
		guestfs.WriteFile(t, filepath.Join(ud, "u"), "upper\n")
		l.Mount(t, ns.mount...)

		expectNames(t, merged(l, "d"), "a", "c", "u")
		expectENOENT(t, merged(l, "d", "b"))

		if err := os.Remove(merged(l, "d", "a")); err != nil {
			t.Fatalf("unlink lower file: %v", err)
		}
		if !isWhiteout(t, filepath.Join(ud, "a")) {
			t.Errorf("unlink of a lower file left no whiteout in upper")
		}
		expectNames(t, merged(l, "d"), "c", "u")
		expectENOENT(t, merged(l, "d", "a"))

		// A removed name can come back, from the upper layer.
		guestfs.WriteFile(t, merged(l, "d", "b"), "again\n")
		expectNames(t, merged(l, "d"), "b", "c", "u")
		if b, err := os.ReadFile(merged(l, "d", "b")); err != nil || string(b) != "again\n" {
			t.Errorf("read recreated b = %q, %v; want %q", b, err, "again\n")
		}

		for _, n := range []string{"b", "c", "u"} {
			if err := os.Remove(merged(l, "d", n)); err != nil {
				t.Fatalf("unlink %s: %v", n, err)
			}
		}
		if err := os.Remove(merged(l, "d")); err != nil {
			t.Fatalf("rmdir emptied merge dir: %v", err)
		}
		expectENOENT(t, merged(l, "d"))
	})
}

// Regression: an empty opaque directory, empty from the start or emptied
// through the overlay, is removed by rmdir, leaving a whiteout only when a
// lower layer has the directory; an opaque directory holding a real entry
// still fails with ENOTEMPTY.
func TestOpaqueDirRmdirEmpty(t *testing.T) {
	guesttest.Keeps(t, "rmdir of an empty opaque dir works and of a non-empty one fails with ENOTEMPTY")
	forEachNS(t, func(t *testing.T, fs guesttest.FS, ns xattrNS) {
		lowerCases(t, func(t *testing.T, withLower bool) {
			l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
			guestfs.WriteFile(t, filepath.Join(l.Lower[0], "top"), "lower top\n")
			for _, d := range []string{"empty", "emptied", "full"} {
				if withLower {
					guestfs.MkdirAll(t, filepath.Join(l.Lower[0], d))
					guestfs.WriteFile(t, filepath.Join(l.Lower[0], d, "secret"), "hidden by opaque\n")
				}
				guestfs.MkdirAll(t, filepath.Join(l.Upper, d))
				setXattr(t, filepath.Join(l.Upper, d), ns.opaque(), "y")
			}
			guestfs.WriteFile(t, filepath.Join(l.Upper, "emptied", "f1"), "upper\n")
			guestfs.WriteFile(t, filepath.Join(l.Upper, "emptied", "f2"), "upper\n")
			guestfs.WriteFile(t, filepath.Join(l.Upper, "full", "keep"), "upper\n")
			l.Mount(t, ns.mount...)

			for _, f := range []string{"f1", "f2"} {
				if err := os.Remove(merged(l, "emptied", f)); err != nil {
					t.Fatalf("unlink emptied/%s: %v", f, err)
				}
			}
			for _, d := range []string{"empty", "emptied"} {
				if err := unix.Rmdir(merged(l, d)); err != nil {
					t.Errorf("rmdir of the empty opaque dir %s: %v", d, err)
					continue
				}
				expectENOENT(t, merged(l, d))
				if withLower {
					if !isWhiteout(t, filepath.Join(l.Upper, d)) {
						t.Errorf("upper/%s is not a whiteout after rmdir of a dir that lower0 has", d)
					}
				} else {
					expectENOENT(t, filepath.Join(l.Upper, d))
				}
			}
			if err := unix.Rmdir(merged(l, "full")); !errors.Is(err, unix.ENOTEMPTY) {
				t.Errorf("rmdir of an opaque dir holding a file: %v, want ENOTEMPTY", err)
			}
			expectNames(t, merged(l, "full"), "keep")
			expectNames(t, l.Merged, "full", "top")
		})
	})
}
