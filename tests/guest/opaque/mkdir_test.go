//go:build ovlkit_guest

package opaque

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// dirState is what a program can observe of a directory through readdir
// and lseek.
type dirState struct {
	walk seekWalk
	inos map[string]uint64 // d_ino by name
}

// observeDir records dirState of the overlay directory dir and checks it
// against realDir, the upper directory it is read from.
func observeDir(t *testing.T, dir, realDir string, entries int, names ...string) dirState {
	t.Helper()
	expectSeekLikeReal(t, dir, realDir, entries)
	expectDinoIsStIno(t, dir, names...)
	s := dirState{walk: walkSeek(t, dir, (entries+2)/2), inos: map[string]uint64{}}
	for _, d := range append(slices.Clone(s.walk.first), s.walk.rest...) {
		s.inos[d.name] = d.ino
	}
	return s
}

// emptyAndRmdir removes what dir holds, then dir itself with rmdir(2).
func emptyAndRmdir(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("readdir %s: %v", dir, err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			t.Fatalf("remove %s/%s: %v", dir, e.Name(), err)
		}
	}
	if err := unix.Rmdir(dir); err != nil {
		t.Fatalf("rmdir %s after removing its %d entries: %v", dir, len(ents), err)
	}
	expectENOENT(t, dir)
}

// A directory made by mkdir in a merge directory is created opaque (with
// redirect_dir or index on). It must behave the same while the dentry
// mkdir made is cached and after the kernel dropped it and looked the
// directory up again: same names, d_ino, lseek results and offsets, and
// rmdir works in both states.
func TestMkdirDirBehavesAsLookedUp(t *testing.T) {
	guesttest.Keeps(t, "a dir made by mkdir behaves after a fresh lookup as before it")
	forEachNS(t, func(t *testing.T, fs guesttest.FS, ns xattrNS) {
		opts := impureOptions(ns)
		opt := opts[len(opts)-1]
		l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
		guestfs.MkdirAll(t, filepath.Join(l.Lower[0], "m"))
		guestfs.WriteFile(t, filepath.Join(l.Lower[0], "m", "a"), "lower a\n")
		guestfs.WriteFile(t, filepath.Join(l.Lower[0], "m", "b"), "lower b\n")
		l.Mount(t, append([]string{opt}, ns.mount...)...)

		// Each new directory holds files made through the overlay, a
		// subdirectory, and a lower file moved in (copied up: impure).
		var names []string
		for i := 0; i < seekEntries; i++ {
			names = append(names, fmt.Sprintf("entry-%05d", i))
		}
		for _, mv := range [][2]string{{"new1", "a"}, {"new2", "b"}} {
			d := merged(l, "m", mv[0])
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatalf("mkdir %s: %v", d, err)
			}
			expectXattrY(t, filepath.Join(l.Upper, "m", mv[0]), ns.opaque())
			fillDir(t, d, seekEntries)
			guestfs.MkdirAll(t, filepath.Join(d, "sub"))
			if err := os.Rename(merged(l, "m", mv[1]), filepath.Join(d, mv[1])); err != nil {
				t.Fatalf("rename m/%s into %s: %v", mv[1], d, err)
			}
		}
		want := func(moved string) []string { return append(slices.Clone(names), "sub", moved) }
		const entries = seekEntries + 2

		var before dirState
		t.Run("before", func(t *testing.T) {
			before = observeDir(t, merged(l, "m", "new2"), filepath.Join(l.Upper, "m", "new2"), entries, want("b")...)
			observeDir(t, merged(l, "m", "new1"), filepath.Join(l.Upper, "m", "new1"), entries, want("a")...)
			emptyAndRmdir(t, merged(l, "m", "new1"))
			expectENOENT(t, filepath.Join(l.Upper, "m", "new1"))
		})

		dropDentries(t)
		t.Run("after-drop-caches", func(t *testing.T) {
			// observeDir checks SEEK_END against the real directory again:
			// comparing it with before would test the filesystem, as xfs
			// reports a directory's size as 0 until it reads the inode back.
			after := observeDir(t, merged(l, "m", "new2"), filepath.Join(l.Upper, "m", "new2"), entries, want("b")...)
			if after.walk.mid != before.walk.mid {
				t.Errorf("telldir after the first half: %d, before the fresh lookup %d", after.walk.mid, before.walk.mid)
			}
			for _, part := range []struct {
				name     string
				got, was []dirent
			}{{"first half", after.walk.first, before.walk.first}, {"second half", after.walk.rest, before.walk.rest}} {
				if d := sameNamesAndOffsets(part.got, part.was); d != "" {
					t.Errorf("%s vs before the fresh lookup: %s", part.name, d)
				}
			}
			for name, ino := range after.inos {
				if was, ok := before.inos[name]; ok && was != ino {
					t.Errorf("d_ino of %s: %d, before the fresh lookup %d", name, ino, was)
				}
			}
			emptyAndRmdir(t, merged(l, "m", "new2"))
			expectENOENT(t, filepath.Join(l.Upper, "m", "new2"))
			expectNames(t, merged(l, "m"))
		})
	})
}

// dropDentries asks the kernel to free unused dentries and inodes, so that
// the next access to a path looks it up again instead of reusing what
// mkdir or an earlier lookup left in the cache.
func dropDentries(t testing.TB) {
	t.Helper()
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2\n"), 0o644); err != nil {
		t.Fatalf("drop dentries and inodes: %v", err)
	}
}
