//go:build ovlkit_guest

package graphsuite

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// Get of a writable layer without a parent returns its diff directory,
// as moby's overlay2 does, instead of mounting it over an empty lower;
// what is written there is what a mount would have written, Diff and
// Changes read it alike, and the reference is counted as a mount's is.
func TestGetWithoutParent(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		ctx := context.Background()
		s := newStore(t, fs, layout)
		diff := func(id string) string { return filepath.Join(s.Home(), "layers", id, "diff") }
		must(t, s.CreateReadWrite(ctx, "c", ""))
		p := get(t, s, "c")
		if p != diff("c") {
			t.Fatalf("get: %s, want the diff directory %s", p, diff("c"))
		}
		wantMounted(t, p, false, "a layer without a parent")
		guestfs.Write(t, filepath.Join(p, "a"), "a", 0o644)
		guestfs.Write(t, filepath.Join(p, "gone"), "x", 0o644)
		must(t, os.MkdirAll(filepath.Join(p, "d/e"), 0o755))
		must(t, os.Remove(filepath.Join(p, "gone")))
		if err := s.Remove(ctx, "c"); !errors.Is(err, graph.ErrMounted) {
			t.Errorf("remove while referenced: %v, want ErrMounted", err)
		}
		if err := s.Create(ctx, "child", "c"); !errors.Is(err, graph.ErrMounted) {
			t.Errorf("child while referenced: %v, want ErrMounted", err)
		}
		st, err := s.Status()
		must(t, err)
		if len(st.Mounted) != 1 || st.Mounted[0].Path != p || st.Mounted[0].Refs != 1 || st.Mounted[0].CopyUp != nil {
			t.Errorf("status %+v", st.Mounted)
		}
		if probs, err := s.Check(); err != nil || len(probs) != 0 {
			t.Errorf("check while referenced: %v %v", probs, err)
		}
		put(t, s, "c")
		if err := s.Put(ctx, "c"); !errors.Is(err, graph.ErrNotMounted) {
			t.Errorf("extra put: %v, want ErrNotMounted", err)
		}
		equalList(t, "tar", sorted(tarNames(t, s, "c")), []string{"a", "d/", "d/e/"})
		equalList(t, "changes", changes(t, s, "c"), []string{"A /a", "A /d", "A /d/e"})

		// Once it has a child, the layer is a read-only view: mounted,
		// as it must not change under the child.
		must(t, s.Create(ctx, "child", "c"))
		ro := get(t, s, "c")
		if ro == diff("c") {
			t.Fatal("a layer with a child was handed out as its diff directory")
		}
		wantMounted(t, ro, true, "a layer with a child")
		if err := os.WriteFile(filepath.Join(ro, "b"), nil, 0o644); !errors.Is(err, unix.EROFS) {
			t.Errorf("write into a layer with a child: %v, want EROFS", err)
		}
		put(t, s, "c")

		// An image layer without a parent: its diff directory in the
		// overlay layout, where its content is that directory; a
		// read-only mount of its tree in the hardlink layout.
		must(t, s.Create(ctx, "img", ""))
		apply(t, s, "img", mkTar(t, file("f", "content")))
		ip := get(t, s, "img")
		if layout == graph.LayoutOverlay {
			if ip != diff("img") {
				t.Errorf("image layer: %s, want %s", ip, diff("img"))
			}
			guestfs.Write(t, filepath.Join(ip, "g"), "g", 0o644)
		} else {
			wantMounted(t, ip, true, "an image layer of the hardlink layout")
		}
		if b, err := os.ReadFile(filepath.Join(ip, "f")); err != nil || string(b) != "content" {
			t.Errorf("image layer content: %q %v", b, err)
		}
		put(t, s, "img")
		if probs, err := s.Check(); err != nil || len(probs) != 0 {
			t.Errorf("check after writing into an applied layer: %v %v", probs, err)
		}
	})
}

// A store with userxattr mounts even a layer without a parent: through
// the mount, overlayfs refuses to let a writer set its user.overlay.*
// xattrs, which would take effect once the layer is a lower.
func TestGetWithoutParentUserxattrMounts(t *testing.T) {
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		if !storesUserXattrs(t, fs.Scratch(t, "")) {
			t.Skipf("%s stores no user xattrs, so it holds no userxattr store", fs.Name)
		}
		s := newStore(t, fs, graph.LayoutOverlay, func(o *graph.Options) { o.Userxattr = true })
		must(t, s.CreateReadWrite(context.Background(), "c", ""))
		p := get(t, s, "c")
		wantMounted(t, p, true, "a userxattr store's layer")
		// The kernel refuses the write (6.1) or stores it escaped, as
		// user.overlay.overlay.opaque (since 6.7): either way the layer's
		// directory must not get an xattr the overlay would obey.
		err := unix.Setxattr(p, "user.overlay.opaque", []byte("y"), 0)
		t.Logf("set user.overlay.opaque through the mount: %v", err)
		put(t, s, "c")
		diff := filepath.Join(s.Home(), "layers", "c", "diff")
		buf := make([]byte, 16)
		if n, err := unix.Getxattr(diff, "user.overlay.opaque", buf); err == nil {
			t.Errorf("the layer's diff directory got user.overlay.opaque=%q through the mount", buf[:n])
		} else if !errors.Is(err, unix.ENODATA) {
			t.Errorf("read user.overlay.opaque of %s: %v", diff, err)
		}
	})
}
