package layer

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// flatten merges layers (bottom first) into dst the way a tar layer is
// applied onto a full tree: a whiteout removes, an opaque directory starts
// empty, anything else replaces what was there. It is written
// independently of fsView so that it can check it. Overlay xattrs are not
// copied.
func flatten(t testing.TB, dst string, layersBottomFirst ...string) {
	t.Helper()
	mkdirs(t, dst)
	for _, layer := range layersBottomFirst {
		err := filepath.Walk(layer, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(layer, p)
			if rel == "." {
				return nil
			}
			out := filepath.Join(dst, rel)
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				return err
			}
			if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
				return os.RemoveAll(out)
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				var old unix.Stat_t
				exists := unix.Lstat(out, &old) == nil
				opaque, _, _ := lgetxattr(p, "trusted.overlay.opaque")
				if exists && (old.Mode&unix.S_IFMT != unix.S_IFDIR || string(opaque) == "y") {
					if err := os.RemoveAll(out); err != nil {
						return err
					}
					exists = false
				}
				if !exists {
					if err := os.Mkdir(out, 0o700); err != nil {
						return err
					}
				} else {
					// A merged directory shows the topmost one's xattrs.
					old, err := listXattrs(out)
					if err != nil {
						return err
					}
					for k := range old {
						if err := unix.Lremovexattr(out, k); err != nil {
							return err
						}
					}
				}
			} else {
				if err := os.RemoveAll(out); err != nil {
					return err
				}
				switch st.Mode & unix.S_IFMT {
				case unix.S_IFREG:
					data, err := os.ReadFile(p)
					if err != nil {
						return err
					}
					if err := os.WriteFile(out, data, 0o600); err != nil {
						return err
					}
				case unix.S_IFLNK:
					target, err := os.Readlink(p)
					if err != nil {
						return err
					}
					if err := os.Symlink(target, out); err != nil {
						return err
					}
				default:
					if err := unix.Mknod(out, st.Mode, int(st.Rdev)); err != nil {
						return err
					}
				}
			}
			if err := os.Lchown(out, int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
			if st.Mode&unix.S_IFMT != unix.S_IFLNK {
				if err := unix.Chmod(out, st.Mode&0o7777); err != nil {
					return err
				}
			}
			xs, err := listXattrs(p)
			if err != nil {
				return err
			}
			for k, v := range xs {
				if err := unix.Lsetxattr(out, k, v, 0); err != nil {
					return err
				}
			}
			return unix.UtimesNanoAt(unix.AT_FDCWD, out, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
		})
		if err != nil {
			t.Fatalf("flatten %s: %v", layer, err)
		}
	}
}

func reversed(s []string) []string {
	out := append([]string(nil), s...)
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// checkChanges asserts that the native Changes of upper over lowers (top
// first) and TreeChanges of the flattened trees both equal want.
func checkChanges(t *testing.T, upper string, lowers []string, flatOld, flatNew string, want []string) {
	t.Helper()
	native, err := Changes(context.Background(), upper, lowers, ExportOptions{Lowers: lowers})
	if err != nil {
		t.Fatalf("Changes: %v", err)
	}
	ref, err := TreeChanges(context.Background(), flatOld, flatNew)
	if err != nil {
		t.Fatalf("TreeChanges: %v", err)
	}
	equalLists(t, "TreeChanges (reference)", changeStrings(ref), want)
	equalLists(t, "Changes (native)", changeStrings(native), want)
}

// TestChangesHandmade covers what moby's native overlay diff gets wrong
// or falls back on: a rewrite with equal size and mtime, a symlink
// retargeted with the same mtime, a copy-up that changed nothing, an
// opaque directory over a populated one, a whiteout of nothing.
func TestChangesHandmade(t *testing.T) {
	base := t.TempDir()
	lower, upper := filepath.Join(base, "lower"), filepath.Join(base, "upper")
	flatOld, flatNew := filepath.Join(base, "old"), filepath.Join(base, "new")
	lowerEnts := []fsEnt{
		d("a"), f("a/f1", "one"), f("a/f2", "two"), d("b"), f("c", "c"),
		d("d"), d("d/e"), f("d/e/f", "f"), f("d/keep", "k"), l("link", "t1"), f("same", "s"),
	}
	build(t, lower, lowerEnts...)
	build(t, flatOld, lowerEnts...)
	build(t, upper,
		d("a"), f("a/f1", "ONE"), f("a/new", "n"),
		d("b").withMode(0o700),
		wh("c"),
		d("d").with("trusted.overlay.opaque", "y"), f("d/g", "g"), f("d/keep", "k"),
		l("link", "t2"),
		f("same", "s"),
		wh("never-existed"),
	)
	build(t, flatNew,
		d("a"), f("a/f1", "ONE"), f("a/f2", "two"), f("a/new", "n"),
		d("b").withMode(0o700), d("d"), f("d/g", "g"), f("d/keep", "k"), l("link", "t2"), f("same", "s"),
	)
	checkChanges(t, upper, []string{lower}, flatOld, flatNew, []string{
		"C /a", "C /a/f1", "A /a/new", "C /b", "D /c", "C /d", "D /d/e", "A /d/g", "C /link",
	})
}

func TestChangesRedirectAndMetacopy(t *testing.T) {
	upper, lower, flatOld, flatNew := redirectScenario(t, t.TempDir())
	checkChanges(t, upper, []string{lower}, flatOld, flatNew, []string{
		"C /big", "D /big2", "A /moved", "A /new", "A /new/a", "A /new/d", "A /new/sub", "A /new/sub/c", "D /old",
	})
	if _, err := Changes(context.Background(), upper, nil, ExportOptions{}); err == nil {
		t.Error("Changes without the lowers succeeded on a metacopy'd diff")
	}
}

func TestChangesUserXattrFormat(t *testing.T) {
	base := t.TempDir()
	lower, upper := filepath.Join(base, "lower"), filepath.Join(base, "upper")
	build(t, lower, d("d"), f("d/x", "x"), f("y", "y"), f("z", "z"))
	build(t, upper, d("d").with("user.overlay.opaque", "y"), wh("y"), f("z", "").with("user.overlay.whiteout", "y"))
	got, err := Changes(context.Background(), upper, []string{lower}, ExportOptions{Whiteouts: OverlayUserWhiteouts})
	if err != nil {
		t.Fatal(err)
	}
	equalLists(t, "changes", changeStrings(got), []string{"C /d", "D /d/x", "D /y", "D /z"})
	b := exportBytes(t, upper, ExportOptions{Whiteouts: OverlayUserWhiteouts, Lowers: []string{lower}})
	equalLists(t, "tar", tarNames(t, b), []string{"d/", "d/.wh..wh..opq", ".wh.y", ".wh.z"})
}

func TestTreeChangesNoOld(t *testing.T) {
	root := t.TempDir()
	build(t, root, d("a"), f("a/b", "b"), f("c", "c"))
	got, err := TreeChanges(context.Background(), "", root)
	if err != nil {
		t.Fatal(err)
	}
	equalLists(t, "changes", changeStrings(got), []string{"A /a", "A /a/b", "A /c"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := TreeChanges(ctx, "", root); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled TreeChanges: %v", err)
	}
}

// randomLayer fills dir with random entries over a small namespace, so
// that layers collide: files over directories, whiteouts over both,
// opaque directories, equal and different content, owners and modes.
func randomLayer(t *testing.T, rng *rand.Rand, dir string, upper bool) {
	mkdirs(t, dir)
	paths := []string{"a", "b", "c", "a/x", "a/y", "b/x", "a/x/z", "a/x/w", "b/x/z", "c/q"}
	bodies := []string{"", "1", "22", "333", "abc"}
	n := 2 + rng.Intn(7)
	for i := 0; i < n; i++ {
		p := paths[rng.Intn(len(paths))]
		full := filepath.Join(dir, p)
		// Parents must be directories in this layer.
		ok := true
		for q := filepath.Dir(p); q != "."; q = filepath.Dir(q) {
			var st unix.Stat_t
			err := unix.Lstat(filepath.Join(dir, q), &st)
			if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				ok = false
			}
		}
		if _, err := os.Lstat(full); err == nil || !ok {
			continue
		}
		var e fsEnt
		switch k := rng.Intn(10); {
		case k < 4:
			e = f(p, bodies[rng.Intn(len(bodies))])
			if rng.Intn(4) == 0 {
				e = e.withMode(0o600)
			}
		case k < 6:
			e = d(p)
			if rng.Intn(3) == 0 {
				e = e.with("trusted.overlay.opaque", "y")
			}
		case k < 7:
			e = l(p, bodies[rng.Intn(len(bodies))]+"t")
		case k < 9 && upper:
			e = wh(p)
		default:
			e = f(p, "x").withOwner(rng.Intn(2))
		}
		if rng.Intn(5) == 0 {
			e = e.with("trusted.note", bodies[rng.Intn(len(bodies))]+"v")
		}
		build(t, dir, e)
	}
}

// TestChangesMatchTreeChangesRandom compares the native Changes with the
// reference on random stacks, and checks that the exported diff applied
// over the same lowers gives the same merged tree.
func TestChangesMatchTreeChangesRandom(t *testing.T) {
	iterations := 120
	if testing.Short() {
		iterations = 30
	}
	for i := 0; i < iterations; i++ {
		seed := int64(i)
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewSource(seed))
			base := t.TempDir()
			var lowers []string // top first
			for j := 0; j < 1+rng.Intn(3); j++ {
				ld := filepath.Join(base, fmt.Sprint("l", j))
				randomLayer(t, rng, ld, j > 0)
				lowers = append([]string{ld}, lowers...)
			}
			upper := filepath.Join(base, "upper")
			randomLayer(t, rng, upper, true)
			flatOld, flatNew := filepath.Join(base, "old"), filepath.Join(base, "new")
			flatten(t, flatOld, reversed(lowers)...)
			flatten(t, flatNew, append(reversed(lowers), upper)...)

			native, err := Changes(context.Background(), upper, lowers, ExportOptions{Lowers: lowers})
			if err != nil {
				t.Fatalf("Changes: %v", err)
			}
			ref, err := TreeChanges(context.Background(), flatOld, flatNew)
			if err != nil {
				t.Fatalf("TreeChanges: %v", err)
			}
			if strings.Join(changeStrings(native), ",") != strings.Join(changeStrings(ref), ",") {
				t.Errorf("native %v\nreference %v\nlowers %v\nupper %v", native, ref, describeLayers(t, lowers), tree(t, upper))
			}

			b := exportBytes(t, upper, ExportOptions{Lowers: lowers})
			applied := filepath.Join(base, "applied")
			mkdirs(t, applied)
			mustApply(t, applied, b, ApplyOptions{Lowers: lowers})
			flatApplied := filepath.Join(base, "flat-applied")
			flatten(t, flatApplied, append(reversed(lowers), applied)...)
			equalLists(t, "merged tree of the re-applied export", tree(t, flatApplied), tree(t, flatNew))
		})
	}
}

func describeLayers(t *testing.T, layers []string) [][]string {
	var out [][]string
	for _, l := range layers {
		out = append(out, tree(t, l))
	}
	return out
}

// fuzzLayers builds layer directories under base from fuzz bytes, two per
// entry: the first picks a path of a small namespace (so that layers
// collide) and what to put there, or ends the layer; the second picks
// content, mode, owner and an xattr. It returns the layers bottom first,
// at most three, none empty-handed: a layer that got no entry stays an
// empty directory. Whiteouts appear in every layer but the bottom one.
func fuzzLayers(t *testing.T, base string, data []byte) []string {
	paths := []string{"a", "b", "c", "a/x", "a/y", "b/x", "a/x/z", "a/x/w", "b/x/z", "c/q"}
	bodies := []string{"", "1", "22", "333", "abc"}
	layers := []string{filepath.Join(base, "l0")}
	mkdirs(t, layers[0])
	for n := 0; len(data) >= 2 && n < 40; n++ {
		op, arg := data[0], data[1]
		data = data[2:]
		dir := layers[len(layers)-1]
		kind := int(op) / len(paths) % 8
		if kind == 7 {
			if len(layers) == 3 {
				break
			}
			layers = append(layers, filepath.Join(base, fmt.Sprint("l", len(layers))))
			mkdirs(t, layers[len(layers)-1])
			continue
		}
		p := paths[int(op)%len(paths)]
		// Parents must be directories in this layer, and the path free.
		ok := true
		for q := filepath.Dir(p); q != "."; q = filepath.Dir(q) {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(dir, q), &st); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				ok = false
			}
		}
		if _, err := os.Lstat(filepath.Join(dir, p)); err == nil || !ok {
			continue
		}
		body := bodies[int(arg)%len(bodies)]
		var e fsEnt
		switch {
		case kind < 3:
			e = f(p, body)
			if arg&0x10 != 0 {
				e = e.withMode(0o600)
			}
		case kind == 3:
			e = d(p)
		case kind == 4:
			e = d(p).with("trusted.overlay.opaque", "y")
		case kind == 5:
			e = l(p, body+"t")
		case len(layers) > 1:
			e = wh(p)
		default:
			e = f(p, "x")
		}
		if arg&0x20 != 0 && e.kind != 'w' {
			e = e.withOwner(1)
		}
		if arg&0x40 != 0 {
			e = e.with("trusted.note", body+"v")
		}
		build(t, dir, e)
	}
	return layers
}

// FuzzChanges runs Changes on layer stacks built from the fuzz input: the
// top layer over no lower (a layer against the empty tree) or over one or
// two lowers. The result must be sorted by path without duplicates, every
// path must be where its kind says (added and changed paths in the new
// merged tree, deleted and changed ones in the old, added ones not in the
// old, deleted ones not in the new), and it must equal TreeChanges on the
// flattened trees, as documented. TreeChanges from no tree lists every
// path of the new tree as added, once.
func FuzzChanges(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		layers := fuzzLayers(t, base, data) // bottom first
		upper := layers[len(layers)-1]
		lowers := reversed(layers[:len(layers)-1]) // top first
		flatOld, flatNew := filepath.Join(base, "old"), filepath.Join(base, "new")
		flatten(t, flatOld, layers[:len(layers)-1]...)
		flatten(t, flatNew, layers...)
		ctx := context.Background()

		native, err := Changes(ctx, upper, lowers, ExportOptions{Lowers: lowers})
		if err != nil {
			t.Fatalf("Changes: %v", err)
		}
		exists := func(root, p string) bool {
			_, err := os.Lstat(filepath.Join(root, p))
			return err == nil
		}
		for i, c := range native {
			if !strings.HasPrefix(c.Path, "/") || c.Path == "/" || path.Clean(c.Path) != c.Path {
				t.Fatalf("change %v: not a clean absolute path below the root", c)
			}
			if i > 0 && native[i-1].Path >= c.Path {
				t.Fatalf("changes not sorted and unique: %v then %v", native[i-1], c)
			}
			inOld, inNew := exists(flatOld, c.Path), exists(flatNew, c.Path)
			if ok := map[ChangeKind]bool{ChangeAdd: inNew && !inOld, ChangeModify: inNew && inOld, ChangeDelete: inOld && !inNew}[c.Kind]; !ok {
				t.Fatalf("change %v: in the old tree %v, in the new %v", c, inOld, inNew)
			}
		}
		ref, err := TreeChanges(ctx, flatOld, flatNew)
		if err != nil {
			t.Fatalf("TreeChanges: %v", err)
		}
		equalLists(t, "Changes against TreeChanges", changeStrings(native), changeStrings(ref))

		all, err := TreeChanges(ctx, "", flatNew)
		if err != nil {
			t.Fatalf("TreeChanges from no tree: %v", err)
		}
		var want []string
		for _, line := range tree(t, flatNew) {
			want = append(want, "A /"+line[:strings.Index(line, ": ")])
		}
		sort.Strings(want)
		equalLists(t, "TreeChanges from no tree", changeStrings(all), want)
	})
}
