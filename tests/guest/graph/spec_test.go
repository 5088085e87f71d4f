//go:build ovlkit_guest

package graphsuite

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// mountSpec mounts a spec as mount(8) would, the way a caller of Acquire
// and View does it itself: the flags among the options become mount
// flags, the rest the data.
func mountSpec(t *testing.T, spec graph.MountSpec) string {
	t.Helper()
	var (
		flags uintptr
		data  []string
	)
	for _, o := range spec.Options {
		switch o {
		case "ro":
			flags |= unix.MS_RDONLY
		case "nosuid":
			flags |= unix.MS_NOSUID
		case "nodev":
			flags |= unix.MS_NODEV
		default:
			data = append(data, o)
		}
	}
	target := t.TempDir()
	if err := unix.Mount(spec.Source, target, spec.Type, flags, strings.Join(data, ",")); err != nil {
		t.Fatalf("mount spec %q: %v", spec.Options, err)
	}
	t.Cleanup(func() { unix.Unmount(target, unix.MNT_DETACH) })
	return target
}

func unmountSpec(t *testing.T, target string) {
	t.Helper()
	must(t, unix.Unmount(target, 0))
}

// A caller that mounts layers itself: Acquire's spec mounts and shows the
// layer's owner and its image, the extra mount option (redirect_dir=on)
// lets the container rename a directory of the image, the hold keeps the
// layer from removal and marks it written, Commit freezes it (the next
// spec mounts read-only), and a view of the image mounts read-only and
// makes no layer.
func TestMountSpecsOnDisk(t *testing.T) {
	guesttest.Keeps(t, "the store's mount specs mount as its own mounts do")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		ctx := context.Background()
		s := newStore(t, fs, graph.LayoutOverlay, noSync, func(o *graph.Options) { o.MountOptions = []string{"redirect_dir=on"} })
		must(t, s.Create(ctx, "img", ""))
		apply(t, s, "img", mkTar(t, dirE("d"), file("d/f", "image")))
		must(t, s.CreateLayer(ctx, "ctr", "img", graph.CreateOptions{ReadWrite: true, Owner: &graph.Owner{UID: 1000, GID: 1001}}))

		spec, err := s.Acquire(ctx, "ctr", "runtime")
		must(t, err)
		root := mountSpec(t, spec)
		var st unix.Stat_t
		must(t, unix.Stat(root, &st))
		if st.Uid != 1000 || st.Gid != 1001 {
			t.Errorf("container root owned by %d:%d, want 1000:1001", st.Uid, st.Gid)
		}
		if b, err := os.ReadFile(filepath.Join(root, "d/f")); err != nil || string(b) != "image" {
			t.Fatalf("image file through the spec's mount: %q, %v", b, err)
		}
		// A lower directory renames only with redirect_dir (EXDEV otherwise).
		must(t, os.Rename(filepath.Join(root, "d"), filepath.Join(root, "e")))
		must(t, os.WriteFile(filepath.Join(root, "new"), []byte("container"), 0o644))
		if err := s.Remove(ctx, "ctr"); !errors.Is(err, graph.ErrMounted) {
			t.Errorf("remove of a held layer: %v, want ErrMounted", err)
		}
		rep, err := s.Verify(ctx, "img")
		must(t, err)
		if rep.State != graph.StateOK {
			t.Errorf("image under the container verifies %s: %v", rep.State, rep.Damage)
		}
		unmountSpec(t, root)
		u, err := s.DiskUsage(ctx, "ctr")
		must(t, err)
		// The diff's root, e (a redirect), the whiteout of d, new; btrfs
		// and xfs may keep small files inline, so only inodes are exact
		// about what the container wrote.
		if u.Inodes != 4 {
			t.Errorf("usage %+v, want 4 inodes", u)
		}
		must(t, s.Release(ctx, "ctr", "runtime"))
		must(t, s.Commit(ctx, "ctr"))

		frozen, err := s.Acquire(ctx, "ctr", "reader")
		must(t, err)
		if !frozen.ReadOnly {
			t.Fatalf("spec of a committed layer is writable: %q", frozen.Options)
		}
		root = mountSpec(t, frozen)
		if b, err := os.ReadFile(filepath.Join(root, "e/f")); err != nil || string(b) != "image" {
			t.Errorf("renamed directory in the committed layer: %q, %v", b, err)
		}
		if err := os.WriteFile(filepath.Join(root, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
			t.Errorf("write into a committed layer: %v, want EROFS", err)
		}
		unmountSpec(t, root)
		must(t, s.Release(ctx, "ctr", "reader"))

		view, err := s.View(ctx, "img", "viewer")
		must(t, err)
		root = mountSpec(t, view)
		if b, err := os.ReadFile(filepath.Join(root, "d/f")); err != nil || string(b) != "image" {
			t.Errorf("image through its view: %q, %v", b, err)
		}
		if err := os.WriteFile(filepath.Join(root, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
			t.Errorf("write into a view: %v, want EROFS", err)
		}
		unmountSpec(t, root)
		must(t, s.Release(ctx, "img", "viewer"))
		ls, err := s.Layers()
		must(t, err)
		if len(ls) != 2 {
			t.Errorf("%d layers, want 2: a view is no layer", len(ls))
		}
		must(t, s.Remove(ctx, "ctr"))
		must(t, s.Remove(ctx, "img"))
	})
}
