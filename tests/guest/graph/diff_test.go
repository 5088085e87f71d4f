//go:build ovlkit_guest

package graphsuite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

func randFiles(t *testing.T, root string, n int, seed int64) {
	t.Helper()
	r := rand.New(rand.NewSource(seed))
	for i := 0; i < n; i++ {
		b := make([]byte, 64+r.Intn(4096))
		r.Read(b)
		guestfs.Write(t, filepath.Join(root, fmt.Sprintf("file-%d", i)), string(b), 0o644)
	}
}

// Group 4, DriverTestDiffApply(10): the diff of a container layer applied
// to a fresh layer on the same parent reproduces it, with the same size.
func TestDiffApply(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout)
		must(t, s.CreateReadWrite(context.Background(), "base", ""))
		p := get(t, s, "base")
		randFiles(t, p, 10, 3)
		guestfs.Write(t, filepath.Join(p, "file-remove.txt"), "remove me", 0o644)
		must(t, os.MkdirAll(filepath.Join(p, "var/lib"), 0o755))
		put(t, s, "base")

		must(t, s.CreateReadWrite(context.Background(), "upper", "base"))
		p = get(t, s, "upper")
		randFiles(t, p, 10, 6)
		must(t, os.Remove(filepath.Join(p, "file-remove.txt")))
		must(t, os.RemoveAll(filepath.Join(p, "var/lib")))
		put(t, s, "upper")
		want, err := s.DiffSize("upper")
		must(t, err)
		if want == 0 {
			t.Fatal("DiffSize of a layer that rewrote 10 files is 0")
		}

		must(t, s.Create(context.Background(), "diff", "base"))
		d := get(t, s, "diff")
		if _, err := os.Stat(filepath.Join(d, "file-remove.txt")); err != nil {
			t.Fatalf("new layer on base lacks file-remove.txt: %v", err)
		}
		put(t, s, "diff")
		n := apply(t, s, "diff", diffBytes(t, s, "upper"))
		if n != want {
			t.Errorf("ApplyDiff size %d, DiffSize %d", n, want)
		}
		if got, _ := s.DiffSize("diff"); got != want {
			t.Errorf("DiffSize(applied) %d, DiffSize(original) %d", got, want)
		}
		up := get(t, s, "upper")
		d = get(t, s, "diff")
		sameTree(t, "applied layer", d, up)
		for _, gone := range []string{"file-remove.txt", "var/lib"} {
			if _, err := os.Lstat(filepath.Join(d, gone)); !os.IsNotExist(err) {
				t.Errorf("%s present after apply: %v", gone, err)
			}
		}
		put(t, s, "diff")
		put(t, s, "upper")
	})
}

// populate builds three container layers as containers/storage's
// populate does: L1 adds files and directories (empty, nested, with
// files), L2 deletes files, empty dirs and trees and adds new ones, L3
// re-creates deleted names and nests new directories under survivors.
func populate(t *testing.T, s *graph.Store) {
	t.Helper()
	must(t, s.CreateReadWrite(context.Background(), "L1", ""))
	p := get(t, s, "L1")
	guestfs.Write(t, filepath.Join(p, "f1"), "one", 0o644)
	guestfs.Write(t, filepath.Join(p, "f2"), "two", 0o644)
	guestfs.Write(t, filepath.Join(p, "f3"), "three", 0o644)
	must(t, os.MkdirAll(filepath.Join(p, "d1"), 0o755))
	must(t, os.MkdirAll(filepath.Join(p, "d2/sub"), 0o755))
	guestfs.Write(t, filepath.Join(p, "d3/a"), "a", 0o644)
	guestfs.Write(t, filepath.Join(p, "d4/b"), "b", 0o644)
	put(t, s, "L1")

	must(t, s.CreateReadWrite(context.Background(), "L2", "L1"))
	p = get(t, s, "L2")
	must(t, os.Remove(filepath.Join(p, "f1")))
	must(t, os.Remove(filepath.Join(p, "d1")))
	must(t, os.RemoveAll(filepath.Join(p, "d2")))
	must(t, os.RemoveAll(filepath.Join(p, "d3")))
	guestfs.Write(t, filepath.Join(p, "n1"), "new", 0o644)
	guestfs.Write(t, filepath.Join(p, "d4/c"), "c", 0o644)
	guestfs.Write(t, filepath.Join(p, "nd/x"), "x", 0o644)
	put(t, s, "L2")

	must(t, s.CreateReadWrite(context.Background(), "L3", "L2"))
	p = get(t, s, "L3")
	guestfs.Write(t, filepath.Join(p, "d2/new"), "again", 0o644)
	guestfs.Write(t, filepath.Join(p, "f1"), "reborn", 0o644)
	must(t, os.MkdirAll(filepath.Join(p, "d4/e/deep"), 0o755))
	put(t, s, "L3")
}

var (
	populateChanges = map[string][]string{
		"L1": {"A /d1", "A /d2", "A /d2/sub", "A /d3", "A /d3/a", "A /d4", "A /d4/b", "A /f1", "A /f2", "A /f3"},
		"L2": {"D /d1", "D /d2", "D /d3", "C /d4", "A /d4/c", "D /f1", "A /n1", "A /nd", "A /nd/x"},
		"L3": {"A /d2", "A /d2/new", "C /d4", "A /d4/e", "A /d4/e/deep", "A /f1"},
	}
	// The exact tar members, sorted: L2 whites out each deleted top-level
	// name and has no opaque marker; L3 re-creates d2 over L2's whiteout
	// and still needs no opaque marker.
	populateTars = map[string][]string{
		"L1": {"d1/", "d2/", "d2/sub/", "d3/", "d3/a", "d4/", "d4/b", "f1", "f2", "f3"},
		"L2": {".wh.d1", ".wh.d2", ".wh.d3", ".wh.f1", "d4/", "d4/c", "n1", "nd/", "nd/x"},
		"L3": {"d2/", "d2/new", "d4/", "d4/e/", "d4/e/deep/", "f1"},
	}
)

// Group 4: exact change lists (mounted and unmounted), exact tar
// listings, and diff → delete → re-apply giving identical changes, tars
// and sizes.
func TestPopulateChangesAndDiffs(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout)
		populate(t, s)
		tars := map[string][]byte{}
		sizes := map[string]int64{}
		for _, id := range []string{"L1", "L2", "L3"} {
			equalList(t, id+" changes", changes(t, s, id), populateChanges[id])
			get(t, s, id)
			equalList(t, id+" changes while mounted", changes(t, s, id), populateChanges[id])
			put(t, s, id)
			equalList(t, id+" tar", sorted(tarNames(t, s, id)), populateTars[id])
			tars[id] = diffBytes(t, s, id)
			n, err := s.DiffSize(id)
			must(t, err)
			if n == 0 {
				t.Errorf("DiffSize(%s) = 0", id)
			}
			sizes[id] = n
		}
		ref := filepath.Join(fs.Scratch(t, ""), "ref")
		must(t, os.Mkdir(ref, 0o755))
		l3 := get(t, s, "L3")
		must(t, copyTree(l3, ref))
		put(t, s, "L3")
		for _, id := range []string{"L3", "L2", "L1"} {
			must(t, s.Remove(context.Background(), id))
		}
		parent := ""
		for _, id := range []string{"L1", "L2", "L3"} {
			must(t, s.Create(context.Background(), id, parent))
			if n := apply(t, s, id, tars[id]); n != sizes[id] {
				t.Errorf("re-applied %s: size %d, was %d", id, n, sizes[id])
			}
			equalList(t, id+" changes after re-apply", changes(t, s, id), populateChanges[id])
			equalList(t, id+" tar after re-apply", sorted(tarNames(t, s, id)), populateTars[id])
			parent = id
		}
		sameTree(t, "re-applied L3", get(t, s, "L3"), ref)
		put(t, s, "L3")
	})
}

// copyTree copies a mounted tree into a plain directory as the flat
// reference (content, modes, owners, symlinks; hard links kept).
func copyTree(src, dst string) error {
	inodes := map[uint64]string{}
	return filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if rel != "." {
				if err := os.Mkdir(target, 0o700); err != nil {
					return err
				}
			}
		case unix.S_IFREG:
			if first, ok := inodes[st.Ino]; ok && st.Nlink > 1 {
				return os.Link(filepath.Join(dst, first), target)
			}
			inodes[st.Ino] = rel
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if err := os.WriteFile(target, b, 0o600); err != nil {
				return err
			}
		case unix.S_IFLNK:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(l, target)
		default:
			if err := unix.Mknod(target, st.Mode, int(st.Rdev)); err != nil {
				return err
			}
		}
		if err := os.Lchown(target, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		return unix.Chmod(target, st.Mode&0o7777)
	})
}

// step changes a tree; the same step is applied to a container layer's
// mount and to the flat reference directory.
type step func(t *testing.T, root string)

// checkSteps is containerd's checkSnapshots: for every step, a container
// layer on the current top is changed through its mount and compared with
// the flat reference; its diff is then applied as a new image layer,
// which must show the same tree again.
func checkSteps(t *testing.T, fs guesttest.FS, layout graph.Layout, steps []step) {
	t.Helper()
	s := newStore(t, fs, layout, noSync)
	flat := filepath.Join(fs.Scratch(t, ""), "flat")
	must(t, os.Mkdir(flat, 0o755))
	top := ""
	for i, st := range steps {
		rw := fmt.Sprintf("rw-%d", i)
		img := fmt.Sprintf("img-%d", i)
		must(t, s.CreateReadWrite(context.Background(), rw, top))
		p := get(t, s, rw)
		sameTree(t, fmt.Sprintf("step %d before change", i), p, flat)
		st(t, p)
		st(t, flat)
		sameTree(t, fmt.Sprintf("step %d container layer", i), p, flat)
		put(t, s, rw)
		tarball := diffBytes(t, s, rw)
		must(t, s.Create(context.Background(), img, top))
		apply(t, s, img, tarball)
		sameTree(t, fmt.Sprintf("step %d image layer", i), get(t, s, img), flat)
		put(t, s, img)
		must(t, s.Remove(context.Background(), rw))
		top = img
		if t.Failed() {
			return
		}
	}
}

func mkdirs(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	must(t, os.MkdirAll(p, 0o755))
	must(t, os.Chmod(p, mode))
}

// Group 6: the containerd snapshotter cases, against a flat directory.
func TestLayerSemantics(t *testing.T) {
	cases := map[string][]step{
		"RemoveDirectoryInLowerLayer": {
			func(t *testing.T, r string) { guestfs.Write(t, filepath.Join(r, "lib/old"), "o", 0o644) },
			func(t *testing.T, r string) {
				must(t, os.RemoveAll(filepath.Join(r, "lib")))
				guestfs.Write(t, filepath.Join(r, "lib/new"), "n", 0o644)
			},
			func(t *testing.T, r string) { guestfs.Write(t, filepath.Join(r, "lib/third"), "3", 0o644) },
		},
		"DeletedFilesInChildSnapshot": {
			func(t *testing.T, r string) {
				guestfs.Write(t, filepath.Join(r, "bin/keep"), "k", 0o755)
				guestfs.Write(t, filepath.Join(r, "bin/gone"), "g", 0o755)
			},
			func(t *testing.T, r string) { must(t, os.Remove(filepath.Join(r, "bin/gone"))) },
			func(t *testing.T, r string) { guestfs.Write(t, filepath.Join(r, "bin/other"), "o", 0o755) },
		},
		"Chown": {
			func(t *testing.T, r string) {
				guestfs.Write(t, filepath.Join(r, "owned/f"), "f", 0o644)
			},
			func(t *testing.T, r string) {
				must(t, os.Lchown(filepath.Join(r, "owned"), 1000, 1000))
				must(t, os.Lchown(filepath.Join(r, "owned/f"), 1001, 1002))
			},
		},
		"DirectoryPermissionOnCommit": {
			func(t *testing.T, r string) {
				mkdirs(t, filepath.Join(r, "d1"), 0o700)
				must(t, os.Lchown(filepath.Join(r, "d1"), 1, 1))
				mkdirs(t, filepath.Join(r, "d2"), 0o750)
			},
			func(t *testing.T, r string) {
				must(t, os.RemoveAll(filepath.Join(r, "d1")))
				mkdirs(t, filepath.Join(r, "d1"), 0o711)
				must(t, os.Lchown(filepath.Join(r, "d1"), 2, 2))
				guestfs.Write(t, filepath.Join(r, "d2/f"), "f", 0o600)
			},
			func(t *testing.T, r string) {
				must(t, os.Lchown(filepath.Join(r, "d2"), 3, 3))
			},
		},
		"MoveFileFromLowerLayer": {
			func(t *testing.T, r string) {
				guestfs.Write(t, filepath.Join(r, "dir1/f1"), "1", 0o644)
				guestfs.Write(t, filepath.Join(r, "dir2/f2"), "2", 0o644)
				mkdirs(t, filepath.Join(r, "dir3"), 0o755)
			},
			func(t *testing.T, r string) {
				must(t, os.RemoveAll(filepath.Join(r, "dir1")))
				must(t, os.Link(filepath.Join(r, "dir2/f2"), filepath.Join(r, "dir3/f2")))
				must(t, os.Remove(filepath.Join(r, "dir2/f2")))
			},
		},
		"Rename": {
			func(t *testing.T, r string) {
				guestfs.Write(t, filepath.Join(r, "a"), "a", 0o644)
				guestfs.Write(t, filepath.Join(r, "b"), "b", 0o644)
				guestfs.Write(t, filepath.Join(r, "c"), "c", 0o644)
			},
			func(t *testing.T, r string) {
				must(t, os.Rename(filepath.Join(r, "a"), filepath.Join(r, "a2")))
				must(t, os.Rename(filepath.Join(r, "b"), filepath.Join(r, "c")))
			},
		},
		"RootPermission": {
			func(t *testing.T, r string) { must(t, os.Chmod(r, 0o755)) },
		},
		// continuity's FSSuite cases, through overlay apply (group 7).
		"Basic": {
			func(t *testing.T, r string) {
				guestfs.Write(t, filepath.Join(r, "etc/hosts"), "127.0.0.1 localhost\n", 0o644)
				must(t, os.Link(filepath.Join(r, "etc/hosts"), filepath.Join(r, "etc/hosts.allow")))
				guestfs.Write(t, filepath.Join(r, "usr/local/lib/libnothing.so"), "lib", 0o755)
				must(t, os.Symlink("libnothing.so", filepath.Join(r, "usr/local/lib/libnothing.so.2")))
				mkdirs(t, filepath.Join(r, "home/derek"), 0o700)
			},
			func(t *testing.T, r string) {
				move(t, filepath.Join(r, "home/derek"), filepath.Join(r, "home/notderek"))
				must(t, os.RemoveAll(filepath.Join(r, "usr")))
				must(t, os.Remove(filepath.Join(r, "etc/hosts.allow")))
			},
			func(t *testing.T, r string) {
				must(t, os.RemoveAll(filepath.Join(r, "home")))
				mkdirs(t, filepath.Join(r, "home/derek"), 0o700)
				must(t, os.Link(filepath.Join(r, "etc/hosts"), filepath.Join(r, "etc/hosts.deny")))
			},
		},
		"Update": {
			func(t *testing.T, r string) {
				guestfs.Write(t, filepath.Join(r, "bin/ls"), "ls", 0o755)
				guestfs.Write(t, filepath.Join(r, "lib/libc.so"), "libc", 0o644)
				mkdirs(t, filepath.Join(r, "etc"), 0o755)
			},
			func(t *testing.T, r string) {
				guestfs.Write(t, filepath.Join(r, "bin/ls"), "a different length", 0o755)
				must(t, os.Remove(filepath.Join(r, "lib/libc.so")))
				guestfs.Write(t, filepath.Join(r, "lib/libc.so"), "new libc", 0o644)
				must(t, os.Chmod(filepath.Join(r, "etc"), 0o700))
				must(t, os.Chmod(filepath.Join(r, "bin/ls"), 0o700))
			},
		},
		"ParentDirectoryPermission": {
			func(t *testing.T, r string) {
				mkdirs(t, filepath.Join(r, "dir1"), 0o700)
				guestfs.Write(t, filepath.Join(r, "dir1/f"), "f", 0o644)
				mkdirs(t, filepath.Join(r, "dir2"), 0o751)
				guestfs.Write(t, filepath.Join(r, "dir2/f"), "f", 0o644)
			},
			func(t *testing.T, r string) {
				guestfs.Write(t, filepath.Join(r, "dir1/f"), "f", 0o644)
				guestfs.Write(t, filepath.Join(r, "dir2/f"), "f", 0o644)
			},
		},
		// Without index=on, copying up one name of a lower hard link
		// breaks the link (the other name keeps the lower inode), so the
		// cases link and modify within one layer, as a build step would.
		"HardlinkBeforeModified": {
			func(t *testing.T, r string) { guestfs.Write(t, filepath.Join(r, "a"), "shared", 0o644) },
			func(t *testing.T, r string) {
				must(t, os.Link(filepath.Join(r, "a"), filepath.Join(r, "b")))
				f, err := os.OpenFile(filepath.Join(r, "a"), os.O_WRONLY|os.O_TRUNC, 0)
				must(t, err)
				_, err = f.WriteString("changed")
				must(t, err)
				must(t, f.Close())
			},
		},
		"HardlinkUnmodified": {
			func(t *testing.T, r string) {
				guestfs.Write(t, filepath.Join(r, "a"), "shared", 0o644)
				must(t, os.Link(filepath.Join(r, "a"), filepath.Join(r, "b")))
			},
			func(t *testing.T, r string) { guestfs.Write(t, filepath.Join(r, "c"), "unrelated", 0o644) },
		},
		"HardlinkBeforeUnmodified": {
			func(t *testing.T, r string) { guestfs.Write(t, filepath.Join(r, "a"), "shared", 0o644) },
			func(t *testing.T, r string) { must(t, os.Link(filepath.Join(r, "a"), filepath.Join(r, "b"))) },
			func(t *testing.T, r string) { guestfs.Write(t, filepath.Join(r, "c"), "unrelated", 0o644) },
		},
	}
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		for _, layout := range layouts {
			layout := layout
			t.Run(string(layout), func(t *testing.T) {
				for name, steps := range cases {
					steps := steps
					t.Run(name, func(t *testing.T) { checkSteps(t, fs, layout, steps) })
				}
			})
		}
	})
}

// Group 6, 128LayersMount: a chain of 128 container layers (each the
// next one's parent, as containerd commits them) each overwrite a file,
// add one and rm -rf + recreate a directory; every mount after its change
// equals the flat directory, and so does the diff of the top applied as
// an image layer onto the top's parent.
func TestLayers128Mount(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout, noSync)
		flat := filepath.Join(fs.Scratch(t, ""), "flat")
		must(t, os.Mkdir(flat, 0o755))
		change := func(r string, i int) {
			guestfs.Write(t, filepath.Join(r, "overwriteme"), fmt.Sprintf("layer %d", i), 0o644)
			guestfs.Write(t, filepath.Join(r, "addhere", fmt.Sprintf("file-%d", i)), "add", 0o644)
			must(t, os.RemoveAll(filepath.Join(r, "onlyme")))
			guestfs.Write(t, filepath.Join(r, "onlyme", fmt.Sprintf("file-%d", i)), "only", 0o644)
		}
		parent := ""
		for i := 0; i < 128; i++ {
			id := fmt.Sprintf("c%03d", i)
			must(t, s.CreateReadWrite(context.Background(), id, parent))
			p := get(t, s, id)
			// The view before the change is the parent's, compared after
			// its own change already; check it again now and then only,
			// to keep 128 emulated mounts affordable.
			if i%16 == 0 {
				sameTree(t, id+" before", p, flat)
			}
			change(p, i)
			change(flat, i)
			sameTree(t, id+" after", p, flat)
			put(t, s, id)
			if t.Failed() {
				return
			}
			parent = id
		}
		prev := fmt.Sprintf("c%03d", 126)
		must(t, s.Create(context.Background(), "image", prev))
		apply(t, s, "image", diffBytes(t, s, parent))
		sameTree(t, "image from the top's diff", get(t, s, "image"), flat)
		put(t, s, "image")
	})
}

// Group 5: Echo — deleting at each depth of a 9-level chain reports
// Modify for the ancestors and Delete for the subtree root; re-creating
// reports Add.
func TestChangesEcho(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout, noSync)
		levels := []string{"0", "1", "2", "3", "4", "5", "6", "7", "8"}
		must(t, s.CreateReadWrite(context.Background(), "base", ""))
		p := get(t, s, "base")
		guestfs.Write(t, filepath.Join(append([]string{p}, append(levels, "file")...)...), "x", 0o644)
		put(t, s, "base")
		for d := 0; d <= 8; d++ {
			child, grand := fmt.Sprintf("child-%d", d), fmt.Sprintf("grand-%d", d)
			must(t, s.CreateReadWrite(context.Background(), child, "base"))
			p := get(t, s, child)
			must(t, os.RemoveAll(filepath.Join(append([]string{p}, levels[:d+1]...)...)))
			put(t, s, child)
			var want []string
			for a := 0; a < d; a++ {
				want = append(want, "C /"+filepath.Join(levels[:a+1]...))
			}
			want = append(want, "D /"+filepath.Join(levels[:d+1]...))
			equalList(t, child, changes(t, s, child), want)

			must(t, s.CreateReadWrite(context.Background(), grand, child))
			p = get(t, s, grand)
			guestfs.Write(t, filepath.Join(append([]string{p}, append(levels, "file")...)...), "y", 0o644)
			put(t, s, grand)
			want = nil
			for a := 0; a < d; a++ {
				want = append(want, "C /"+filepath.Join(levels[:a+1]...))
			}
			for a := d; a < len(levels); a++ {
				want = append(want, "A /"+filepath.Join(levels[:a+1]...))
			}
			want = append(want, "A /"+filepath.Join(append(levels, "file")...))
			equalList(t, grand, changes(t, s, grand), want)
		}
	})
}

// Group 5: same-length content changes and mode-only changes within one
// second, and a content change that restores the old mtime, are all seen
// (moby #21555, #8242, #31805); so is a symlink retargeted with its mtime
// restored.
func TestChangesWithinOneSecond(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout, noSync)
		must(t, s.CreateReadWrite(context.Background(), "base", ""))
		p := get(t, s, "base")
		guestfs.Write(t, filepath.Join(p, "etc/hosts"), "aaaa", 0o644)
		must(t, os.Symlink("libc-2.1.so", filepath.Join(p, "etc/libc.so")))
		put(t, s, "base")
		parent := "base"
		for i := 0; i < 5; i++ {
			id := fmt.Sprintf("content-%d", i)
			must(t, s.CreateReadWrite(context.Background(), id, parent))
			p := get(t, s, id)
			hosts := filepath.Join(p, "etc/hosts")
			var before unix.Stat_t
			must(t, unix.Stat(hosts, &before))
			guestfs.Write(t, hosts, fmt.Sprintf("%c%c%c%c", 'b'+i, 'b'+i, 'b'+i, 'b'+i), 0o644)
			must(t, unix.UtimesNano(hosts, []unix.Timespec{before.Atim, before.Mtim}))
			put(t, s, id)
			equalList(t, id, changes(t, s, id), []string{"C /etc", "C /etc/hosts"})

			mid := fmt.Sprintf("mode-%d", i)
			must(t, s.CreateReadWrite(context.Background(), mid, id))
			p = get(t, s, mid)
			must(t, os.Chmod(filepath.Join(p, "etc/hosts"), os.FileMode(0o600+i)))
			put(t, s, mid)
			equalList(t, mid, changes(t, s, mid), []string{"C /etc", "C /etc/hosts"})
			parent = mid
		}
		must(t, s.CreateReadWrite(context.Background(), "relink", parent))
		p = get(t, s, "relink")
		l := filepath.Join(p, "etc/libc.so")
		var before unix.Stat_t
		must(t, unix.Lstat(l, &before))
		must(t, os.Remove(l))
		must(t, os.Symlink("libc-2.2.so", l))
		must(t, unix.UtimesNanoAt(unix.AT_FDCWD, l, []unix.Timespec{before.Atim, before.Mtim}, unix.AT_SYMLINK_NOFOLLOW))
		put(t, s, "relink")
		equalList(t, "relink", changes(t, s, "relink"), []string{"C /etc", "C /etc/libc.so"})
		var buf bytes.Buffer
		must(t, s.Diff(context.Background(), "relink", &buf))
		if !bytes.Contains(buf.Bytes(), []byte("libc-2.2.so")) {
			t.Error("diff of the retargeted symlink lacks the new target")
		}
	})
}

// move renames like mv(1): a directory that overlay cannot rename without
// redirect_dir (EXDEV) is copied with its metadata and removed instead,
// so the flat reference and the mount end up alike.
func move(t *testing.T, from, to string) {
	t.Helper()
	err := os.Rename(from, to)
	if err == nil {
		return
	}
	if !errors.Is(err, unix.EXDEV) {
		t.Fatalf("rename %s: %v", from, err)
	}
	must(t, os.Mkdir(to, 0o700))
	must(t, copyTree(from, to))
	var st unix.Stat_t
	must(t, unix.Lstat(from, &st))
	must(t, os.Lchown(to, int(st.Uid), int(st.Gid)))
	must(t, unix.Chmod(to, st.Mode&0o7777))
	must(t, os.RemoveAll(from))
}
