package snapshotter

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/ovl"
)

// These tests mount nothing: the store's probe is replaced, and what is
// checked is the metadata, the store and the mount specs. The guest
// package tests/guest/snapshotter mounts, with containerd's own suite.
func hostFeatures() *ovl.Features {
	return &ovl.Features{DType: true, Whiteouts: true, Xattrs: true, Overlay: true, MultiLower: true, Notes: map[string]string{}}
}

func openTest(t *testing.T, root string, cfg Config) *Snapshotter {
	t.Helper()
	cfg.Features, cfg.Sync = hostFeatures(), graph.SyncNone
	s, err := Open(context.Background(), root, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func opt(m []mount.Mount, key string) (string, bool) {
	for _, o := range m[0].Options {
		if v, ok := strings.CutPrefix(o, key+"="); ok {
			return v, true
		}
	}
	return "", false
}

func walkNames(t *testing.T, s *Snapshotter, filters ...string) []string {
	t.Helper()
	var out []string
	must(t, s.Walk(context.Background(), func(_ context.Context, i snapshots.Info) error {
		out = append(out, i.Name)
		return nil
	}, filters...))
	sort.Strings(out)
	return out
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, t.TempDir(), Config{MountOptions: []string{"redirect_dir=on"}})
	m, err := s.Prepare(ctx, "a", "", snapshots.WithLabels(map[string]string{"team": "x"}))
	must(t, err)
	if len(m) != 1 || m[0].Type != "overlay" {
		t.Fatalf("mounts %+v", m)
	}
	upper, ok := opt(m, "upperdir")
	if !ok || !slices.Contains(m[0].Options, "redirect_dir=on") || slices.Contains(m[0].Options, "ro") {
		t.Fatalf("active mounts %q", m[0].Options)
	}
	// Write into the upper as a mount would.
	must(t, os.WriteFile(filepath.Join(upper, "file"), make([]byte, 20000), 0o644))
	u, err := s.Usage(ctx, "a")
	must(t, err)
	if u.Inodes != 2 || u.Size < 20000 {
		t.Errorf("usage of the active snapshot %+v, want 2 inodes and at least 20000 bytes", u)
	}
	again, err := s.Mounts(ctx, "a")
	must(t, err)
	if !slices.Equal(again[0].Options, m[0].Options) {
		t.Errorf("Mounts %q, Prepare gave %q", again[0].Options, m[0].Options)
	}

	must(t, s.Commit(ctx, "base", "a", snapshots.WithLabels(map[string]string{"team": "y"})))
	info, err := s.Stat(ctx, "base")
	must(t, err)
	if info.Kind != snapshots.KindCommitted || info.Labels["team"] != "y" {
		t.Errorf("committed info %+v", info)
	}
	if _, err := s.Stat(ctx, "a"); !errdefs.IsNotFound(err) {
		t.Errorf("stat of the committed key: %v", err)
	}
	cu, err := s.Usage(ctx, "base")
	must(t, err)
	if cu != u {
		t.Errorf("usage recorded at commit %+v, measured before %+v", cu, u)
	}
	li, err := s.Store().Layer(layerID("1"))
	must(t, err)
	if !li.Committed || len(li.Holds) != 0 {
		t.Errorf("committed layer %+v", li)
	}

	bm, err := s.Prepare(ctx, "b", "base")
	must(t, err)
	low, _ := opt(bm, "lowerdir")
	if strings.Count(low, ":") != 0 {
		t.Errorf("child of one layer has lowers %q", low)
	}
	vm, err := s.View(ctx, "v", "base")
	must(t, err)
	if !slices.Contains(vm[0].Options, "ro") {
		t.Errorf("view mounts %q", vm[0].Options)
	}
	if _, ok := opt(vm, "upperdir"); ok {
		t.Errorf("view has an upper: %q", vm[0].Options)
	}
	ls, err := s.Store().Layers()
	must(t, err)
	if len(ls) != 2 {
		t.Errorf("%d layers for one committed and one active snapshot and a view, want 2", len(ls))
	}
	empty, err := s.View(ctx, "nothing", "")
	must(t, err)
	if !slices.Contains(empty[0].Options, "ro") {
		t.Errorf("view of nothing %q", empty[0].Options)
	}

	if got := walkNames(t, s); !slices.Equal(got, []string{"b", "base", "nothing", "v"}) {
		t.Errorf("walk %v", got)
	}
	if got := walkNames(t, s, "kind==committed"); !slices.Equal(got, []string{"base"}) {
		t.Errorf("walk kind==committed: %v", got)
	}
	if got := walkNames(t, s, "parent==base"); !slices.Equal(got, []string{"b", "v"}) {
		t.Errorf("walk parent==base: %v", got)
	}
	_, err = s.Update(ctx, snapshots.Info{Name: "b", Labels: map[string]string{"l1": "v1"}}, "labels.l1")
	must(t, err)
	if got := walkNames(t, s, "labels.l1==v1"); !slices.Equal(got, []string{"b"}) {
		t.Errorf("walk labels.l1==v1: %v", got)
	}

	if err := s.Remove(ctx, "base"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("remove of a parent: %v", err)
	}
	if err := s.Commit(ctx, "again", "v"); err == nil {
		t.Error("commit of a view succeeded")
	}
	for _, k := range []string{"b", "v", "nothing", "base"} {
		must(t, s.Remove(ctx, k))
	}
	ls, err = s.Store().Layers()
	must(t, err)
	if len(ls) != 0 {
		t.Errorf("layers left after removing everything: %+v", ls)
	}
	if got := walkNames(t, s); len(got) != 0 {
		t.Errorf("snapshots left: %v", got)
	}
}

func TestRemappedOwner(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, t.TempDir(), Config{})
	m, err := s.Prepare(ctx, "a", "", snapshots.WithLabels(map[string]string{
		uidMapLabel: "0:100000:65536", gidMapLabel: "0:200000:65536"}))
	must(t, err)
	upper, _ := opt(m, "upperdir")
	var st unix.Stat_t
	must(t, unix.Stat(upper, &st))
	if st.Uid != 100000 || st.Gid != 200000 {
		t.Errorf("remapped root owned by %d:%d", st.Uid, st.Gid)
	}
	if _, err := s.Prepare(ctx, "b", "", snapshots.WithLabels(map[string]string{uidMapLabel: "1:5:1", gidMapLabel: "0:1:1"})); !errdefs.IsInvalidArgument(err) {
		t.Errorf("mapping without container root: %v", err)
	}
	if got := walkNames(t, s); !slices.Equal(got, []string{"a"}) {
		t.Errorf("a refused Prepare left snapshots: %v", got)
	}
}

func TestAsyncRemoveAndCleanup(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, t.TempDir(), Config{AsyncRemove: true})
	_, err := s.Prepare(ctx, "a", "")
	must(t, err)
	must(t, s.Remove(ctx, "a"))
	ls, err := s.Store().Layers()
	must(t, err)
	if len(ls) != 1 || len(ls[0].Holds) != 0 {
		t.Fatalf("after an asynchronous remove: %+v, want the layer without holds", ls)
	}
	must(t, s.Cleanup(ctx))
	if ls, _ = s.Store().Layers(); len(ls) != 0 {
		t.Errorf("Cleanup left %+v", ls)
	}
}

// Open reconciles both ways: snapshots whose layers are gone, layers no
// snapshot has, holds of snapshots that are gone and holds that are
// missing.
func TestReconcileOnOpen(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s := openTest(t, root, Config{})
	_, err := s.Prepare(ctx, "a", "")
	must(t, err)
	must(t, s.Commit(ctx, "lost", "a")) // ID 1
	_, err = s.Prepare(ctx, "child-of-lost", "lost")
	must(t, err) // ID 2
	_, err = s.Prepare(ctx, "kept", "")
	must(t, err) // ID 3
	_, err = s.View(ctx, "view-of-lost", "lost")
	must(t, err) // ID 4
	must(t, s.Close())

	st, err := graph.Open(filepath.Join(root, "store"), graph.Options{Features: hostFeatures(), Sync: graph.SyncNone})
	must(t, err)
	// A crash between the two stores: layer 1 and what depends on it
	// gone, a layer nobody recorded, a hold missing, a stray hold.
	must(t, st.Release(ctx, "sn-2", "active-2"))
	must(t, st.Release(ctx, "sn-1", "view-4"))
	must(t, st.Remove(ctx, "sn-2"))
	must(t, st.Remove(ctx, "sn-1"))
	must(t, st.Create(ctx, "sn-77", ""))
	must(t, st.Release(ctx, "sn-3", "active-3"))
	must(t, st.CreateReadWrite(ctx, "foreign", ""))
	// A crash after the store's Commit and before the metadata's.
	must(t, st.Commit(ctx, "sn-3"))
	_, err = st.Acquire(ctx, "foreign", "view-99")
	must(t, err)
	must(t, st.Close())

	cfg := Config{Features: hostFeatures(), Sync: graph.SyncNone}
	s2, err := Open(ctx, root, cfg)
	must(t, err)
	defer s2.Close()
	if got := walkNames(t, s2); !slices.Equal(got, []string{"kept"}) {
		t.Errorf("snapshots after reconciliation: %v, want [kept]", got)
	}
	li, err := s2.Store().Layer("sn-3")
	must(t, err)
	if _, ok := li.Holds["active-3"]; !ok {
		t.Errorf("the active snapshot's hold was not restored: %v", li.Holds)
	}
	rep0, err := s2.Reconcile(ctx)
	must(t, err)
	if !slices.Equal(rep0.Frozen, []string{"kept"}) {
		t.Errorf("frozen active snapshots %v, want [kept]", rep0.Frozen)
	}
	if s2.Store().Exists("sn-77") {
		t.Error("orphan layer sn-77 kept")
	}
	// A layer that is not a snapshot's is not ours to remove.
	if fi, err := s2.Store().Layer("foreign"); err != nil || len(fi.Holds) != 1 {
		t.Errorf("foreign layer: %+v, %v", fi, err)
	}
	rep, err := s2.Reconcile(ctx)
	must(t, err)
	if len(rep.Snapshots)+len(rep.Layers)+len(rep.Released)+len(rep.Restored) != 0 {
		t.Errorf("second reconciliation changed %+v", rep)
	}
	if _, err := s2.Mounts(ctx, "lost"); !errdefs.IsNotFound(err) {
		t.Errorf("mounts of a lost snapshot: %v", err)
	}
	if err := s2.Remove(ctx, "kept"); err != nil {
		t.Error(err)
	}
}

func TestStoreErrorsMapToContainerd(t *testing.T) {
	for _, c := range []struct {
		err  error
		want func(error) bool
	}{
		{graph.ErrNotExist, errdefs.IsNotFound},
		{graph.ErrExist, errdefs.IsAlreadyExists},
		{graph.ErrMounted, errdefs.IsFailedPrecondition},
		{graph.ErrTooDeep, errdefs.IsInvalidArgument},
	} {
		got := storeErr(c.err)
		if !c.want(got) || !errors.Is(got, c.err) {
			t.Errorf("storeErr(%v) = %v", c.err, got)
		}
	}
}
