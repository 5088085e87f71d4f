//go:build ovlkit_guest

package graphsuite

import (
	"archive/tar"
	"context"
	"errors"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// wantStates verifies every layer of s and compares the states.
func wantStates(t *testing.T, s *graph.Store, want map[string]graph.LayerState) []graph.Report {
	t.Helper()
	reps, err := s.VerifyAll(context.Background())
	must(t, err)
	if len(reps) != len(want) {
		t.Errorf("VerifyAll reported %d layers, want %d", len(reps), len(want))
	}
	for _, r := range reps {
		if r.State != want[r.Layer] {
			t.Errorf("%s: state %s, want %s; damage %v", r.Layer, r.State, want[r.Layer], r.Damage)
		}
	}
	return reps
}

func checkClean(t *testing.T, s *graph.Store) {
	t.Helper()
	probs, err := s.Check()
	must(t, err)
	if len(probs) > 0 {
		t.Errorf("check: %s", graph.Summary(probs))
	}
}

// TestVerifyRepairOnDisk runs verify and repair on a store on a real
// backing filesystem with the fsync policy and live overlay mounts: layers
// verify while their children are mounted, a layer written through its
// read-write mount is "changed", damage of the kinds power loss leaves is
// found, Repair refuses while a descendant is mounted, and after Repair
// and a second apply of the same tar the store checks clean and the
// container on top shows the original content with its own files kept.
func TestVerifyRepairOnDisk(t *testing.T) {
	ctx := context.Background()
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout)
		big := make([]byte, 1<<20+17)
		rand.New(rand.NewSource(3)).Read(big)
		passwd := "root:x:0:0:root:/root:/bin/sh\n"
		tars := map[string][]byte{
			"base": mkTar(t, dirE("etc/"), file("etc/passwd", passwd), file("etc/shadow", "root:*::\n"),
				dirE("bin/"), entry{name: "bin/sh", typ: tar.TypeReg, body: string(big), mode: 0o755},
				hardlink("bin/ash", "bin/sh"), symlink("lib", "usr/lib"), dirE("var/"), dirE("var/cache/"), file("var/cache/x", "x")),
			"app": mkTar(t, file("etc/app.conf", "on\n"), file("etc/.wh.shadow", ""),
				dirE("var/cache/"), file("var/cache/.wh..wh..opq", ""), file("var/cache/y", "y")),
			"leaf": mkTar(t, file("leaf", strings.Repeat("leaf", 2000))),
			"rw":   mkTar(t, file("rw", "applied")),
		}
		must(t, s.Create(context.Background(), "base", ""))
		apply(t, s, "base", tars["base"])
		for _, id := range []string{"app", "leaf"} {
			must(t, s.Create(context.Background(), id, "base"))
			apply(t, s, id, tars[id])
		}
		must(t, s.CreateReadWrite(context.Background(), "rw", "base"))
		apply(t, s, "rw", tars["rw"])
		must(t, s.CreateReadWrite(context.Background(), "ctr", "app"))
		sound := map[string]graph.LayerState{"base": graph.StateOK, "app": graph.StateOK, "leaf": graph.StateOK,
			"rw": graph.StateOK, "ctr": graph.StateEmpty}
		wantStates(t, s, sound)

		// A container mounted on app: its lowers verify while in use,
		// and its content is its own.
		root := get(t, s, "ctr")
		guestfs.Write(t, filepath.Join(root, "ctr-file"), "mine", 0o644)
		wantStates(t, s, sound)
		// A layer written after apply is the container's now.
		guestfs.Write(t, filepath.Join(get(t, s, "rw"), "rw"), "changed", 0o644)
		put(t, s, "rw")
		sound["rw"] = graph.StateChanged
		wantStates(t, s, sound)

		// Damage: a file of base cut to 0 bytes, leaf's data zeroed,
		// app's short link gone.
		home := s.Home()
		must(t, os.Truncate(filepath.Join(home, "layers", "base", "diff", "etc", "passwd"), 0))
		must(t, os.WriteFile(filepath.Join(home, "layers", "leaf", "diff", "leaf"), make([]byte, 8000), 0o644))
		li, err := s.Layer("app")
		must(t, err)
		must(t, os.Remove(filepath.Join(home, "l", li.Link)))
		reps := wantStates(t, s, map[string]graph.LayerState{"base": graph.StateDamaged, "app": graph.StateDamaged,
			"leaf": graph.StateDamaged, "rw": graph.StateChanged, "ctr": graph.StateEmpty})
		for _, r := range reps {
			want := map[string]string{"base": "/etc/passwd: truncated to 0 bytes", "leaf": "/leaf: zero-filled",
				"app": "short link l/" + li.Link + " is missing"}[r.Layer]
			if want != "" && (len(r.Damage) != 1 || !strings.HasPrefix(r.Damage[0].String(), want)) {
				t.Errorf("%s: damage %v, want one starting %q", r.Layer, r.Damage, want)
			}
		}

		// base is a lower of the mounted container.
		if _, err := s.Repair(ctx, "base"); !errors.Is(err, graph.ErrMounted) {
			t.Errorf("repair of base under a mounted container: %v, want ErrMounted", err)
		}
		put(t, s, "ctr")
		for _, id := range []string{"app", "leaf"} {
			r, err := s.Repair(ctx, id)
			must(t, err)
			if want := map[string]graph.LayerState{"app": graph.StateOK, "leaf": graph.StateNeedsApply}[id]; r.State != want {
				t.Errorf("%s after repair: %s %v, want %s", id, r.State, r.Damage, want)
			}
		}
		apply(t, s, "leaf", tars["leaf"])
		if layout == graph.LayoutHardlink {
			// Its children's trees share its files.
			if _, err := s.Repair(ctx, "base"); !errors.Is(err, graph.ErrHasChildren) {
				t.Errorf("repair of a hardlink layer with children: %v, want ErrHasChildren", err)
			}
			return
		}
		r, err := s.Repair(ctx, "base")
		must(t, err)
		if r.State != graph.StateNeedsApply {
			t.Fatalf("base after repair: %s %v", r.State, r.Damage)
		}
		checkClean(t, s)
		if _, err := s.Get(context.Background(), "ctr"); !errors.Is(err, graph.ErrNeedsApply) {
			t.Errorf("get of a container on a reset layer: %v, want ErrNeedsApply", err)
		}
		apply(t, s, "base", tars["base"])
		wantStates(t, s, sound)
		checkClean(t, s)

		root = get(t, s, "ctr")
		defer put(t, s, "ctr")
		for p, want := range map[string]string{"etc/passwd": passwd, "ctr-file": "mine", "etc/app.conf": "on\n", "var/cache/y": "y", "bin/ash": string(big)} {
			if got, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(got) != want {
				t.Errorf("%s through the container after repair: %v (%d bytes, want %d)", p, err, len(got), len(want))
			}
		}
		for _, gone := range []string{"etc/shadow", "var/cache/x"} {
			if _, err := os.Lstat(filepath.Join(root, gone)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s through the container: %v, want it hidden by app", gone, err)
			}
		}
	})
}
