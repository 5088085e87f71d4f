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
	"github.com/ovlkit/ovlkit/ovl"
	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// mountOptions returns the superblock options /proc/self/mountinfo shows
// for the mount at path.
func mountOptions(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	must(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && ovl.UnescapeMountField(f[4]) == path {
			if i := strings.Index(line, " - "); i >= 0 {
				return line[i+3:]
			}
		}
	}
	t.Fatalf("%s is not in mountinfo", path)
	return ""
}

// Group 10: the store's own probe (no injected features) on every
// backing filesystem finds what overlay needs, names the filesystem, and
// the mounts carry index=off where the module has an index parameter.
func TestStatusProbes(t *testing.T) {
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		home := filepath.Join(fs.Scratch(t, ""), "store")
		s, err := graph.Open(home, graph.Options{Create: true})
		must(t, err)
		defer s.Close()
		st, err := s.Status()
		must(t, err)
		if st.BackingFS != fs.Name {
			t.Errorf("backing fs %q, want %q", st.BackingFS, fs.Name)
		}
		f := st.Features
		if !f.DType || !f.Overlay || !f.MultiLower {
			t.Errorf("features %+v", f)
		}
		if _, err := os.Stat(filepath.Join(home, "features.json")); err != nil {
			t.Errorf("probe result not cached: %v", err)
		}
		mountableLayer(t, s, "c")
		// The kernel shows index= only when it differs from the module
		// default: with the default turned on, a layer mount must say off
		// (containerd #4311: index=on makes leaked mounts EBUSY).
		if !f.IndexParam {
			t.Fatal("the overlay module has no index parameter")
		}
		setParam(t, "index", "Y")
		p := get(t, s, "c")
		if opts := mountOptions(t, p); !strings.Contains(opts, "index=off") {
			t.Errorf("mount options %q lack index=off", opts)
		}
		st, err = s.Status()
		must(t, err)
		if len(st.Mounted) != 1 || st.Mounted[0].ID != "c" || st.Mounted[0].Refs != 1 {
			t.Errorf("mounted %+v", st.Mounted)
		}
		put(t, s, "c")
		// A second open in the same boot reuses the cached probe.
		s2, err := graph.Open(home, graph.Options{})
		must(t, err)
		if s2.Features().DType != f.DType || s2.Features().StrictUpper != f.StrictUpper {
			t.Errorf("reopened features differ")
		}
		s2.Close()
	})
}

// setParam sets an overlay module parameter for the test and restores it.
func setParam(t *testing.T, name, value string) {
	t.Helper()
	p := "/sys/module/overlay/parameters/" + name
	old, err := os.ReadFile(p)
	must(t, err)
	must(t, os.WriteFile(p, []byte(value), 0o644))
	t.Cleanup(func() { os.WriteFile(p, old, 0o644) })
}

// Group 10: with redirect_dir on (directory renames leave a redirect in
// the upper) and with metacopy on (a chmod copies up metadata only), the
// native diff and changes still describe the layer fully: the applied
// diff equals the container layer.
func TestNativeDiffWithRedirectAndMetacopy(t *testing.T) {
	for _, param := range []string{"redirect_dir", "metacopy"} {
		param := param
		t.Run(param, func(t *testing.T) {
			setParam(t, param, "Y")
			if param == "metacopy" {
				setParam(t, "redirect_dir", "Y") // metacopy needs redirect_dir
			}
			guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
				s := newStore(t, fs, graph.LayoutOverlay, noSync)
				must(t, s.Create(context.Background(), "base", ""))
				apply(t, s, "base", mkTar(t, dirE("dir/"), file("dir/a", "aaaa"), dirE("dir/sub/"), file("dir/sub/b", "bb"), file("big", strings.Repeat("z", 100000))))
				must(t, s.CreateReadWrite(context.Background(), "rw", "base"))
				p := get(t, s, "rw")
				must(t, os.Rename(filepath.Join(p, "dir"), filepath.Join(p, "moved")))
				must(t, os.Chmod(filepath.Join(p, "big"), 0o600))
				put(t, s, "rw")
				want := []string{"C /big", "D /dir", "A /moved", "A /moved/a", "A /moved/sub", "A /moved/sub/b"}
				equalList(t, "changes", changes(t, s, "rw"), want)
				must(t, s.Create(context.Background(), "img", "base"))
				apply(t, s, "img", diffBytes(t, s, "rw"))
				sameTree(t, "applied diff", get(t, s, "img"), get(t, s, "rw"))
				put(t, s, "img")
				put(t, s, "rw")
			})
		})
	}
}

// The driver mounts every layer with the series' strict_upper where the
// kernel has it, so that an upper missing a feature fails the mount.
func TestMountsUseStrictUpper(t *testing.T) {
	guesttest.Proves(t, "ovl: add strict_upper option to fail instead of degrading")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		s := newStore(t, fs, graph.LayoutOverlay)
		mountableLayer(t, s, "c")
		p := get(t, s, "c")
		if opts := mountOptions(t, p); !strings.Contains(opts, "strict_upper") {
			t.Errorf("layer mount options %q lack strict_upper", opts)
		}
		put(t, s, "c")
	})
}

// fsync=strict is offered as a store option and reaches the mounts.
func TestFsyncStrictOption(t *testing.T) {
	guesttest.Proves(t, "ovl: add fsync=auto|strict|volatile mount option")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		s := newStore(t, fs, graph.LayoutOverlay, func(o *graph.Options) { o.FsyncStrict = true })
		mountableLayer(t, s, "c")
		p := get(t, s, "c")
		if opts := mountOptions(t, p); !strings.Contains(opts, "fsync=strict") {
			t.Errorf("layer mount options %q lack fsync=strict", opts)
		}
		put(t, s, "c")
	})
}

// copyUpCounters are the counters the series reports for every overlay
// mount, one file each in /sys/fs/overlay/<major>:<minor>/copy_up.
var copyUpCounters = []string{
	"reg", "dir", "lnk", "spec", "meta", "data", "link",
	"copied_bytes", "cloned_bytes", "hole_bytes", "fsync",
	"fail_enospc", "fail_eintr", "fail_other",
}

// Status shows the copy-up statistics of a mounted layer, read from the
// overlay's sysfs directory: every counter is there, and copying up one
// lower file through the mount counts one regular file and its bytes
// (copied, or cloned where the upper fs shares extents).
func TestStatusCopyUpStats(t *testing.T) {
	guesttest.Proves(t, "ovl: report copy-up statistics in sysfs")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		s := newStore(t, fs, graph.LayoutOverlay)
		if f := s.Features(); !f.CopyUpStats {
			t.Fatalf("probe finds no copy-up statistics: %s", f.Notes["copyup_stats"])
		}
		const data = "lower data"
		must(t, s.Create(context.Background(), "base", ""))
		apply(t, s, "base", mkTar(t, file("f", data)))
		must(t, s.CreateReadWrite(context.Background(), "c", "base"))
		p := get(t, s, "c")
		before, err := s.Status()
		must(t, err)
		if len(before.Mounted) != 1 {
			t.Fatalf("mounted %+v, want layer c only", before.Mounted)
		}
		b := before.Mounted[0].CopyUp
		for _, k := range copyUpCounters {
			if _, ok := b[k]; !ok {
				t.Errorf("status lacks counter %s: %v", k, b)
			}
		}
		if len(b) != len(copyUpCounters) {
			t.Errorf("status shows %d counters %v, want %d", len(b), b, len(copyUpCounters))
		}
		f, err := os.OpenFile(filepath.Join(p, "f"), os.O_WRONLY|os.O_APPEND, 0)
		must(t, err)
		_, err = f.WriteString(" more")
		must(t, err)
		must(t, f.Close())
		after, err := s.Status()
		must(t, err)
		if len(after.Mounted) != 1 {
			t.Fatalf("mounted %+v, want layer c only", after.Mounted)
		}
		a := after.Mounted[0].CopyUp
		if a["reg"] != b["reg"]+1 {
			t.Errorf("reg %d -> %d, want one copy-up more", b["reg"], a["reg"])
		}
		if got := a["copied_bytes"] + a["cloned_bytes"] - b["copied_bytes"] - b["cloned_bytes"]; got != uint64(len(data)) {
			t.Errorf("copied and cloned bytes grew by %d, want %d (before %v, after %v)", got, len(data), b, a)
		}
		put(t, s, "c")
	})
}

// storesUserXattrs reports whether dir's filesystem keeps user.* xattrs
// (tmpfs gained them only in 6.6).
func storesUserXattrs(t *testing.T, dir string) bool {
	t.Helper()
	p := filepath.Join(dir, "xattr-check")
	must(t, os.WriteFile(p, nil, 0o644))
	defer os.Remove(p)
	return unix.Lsetxattr(p, "user.check", []byte("y"), 0) == nil
}

// Group 10, userxattr: a store created with Userxattr keeps opaque
// markers as user.overlay.opaque, mounts with userxattr and exports the
// same tar members as a trusted.overlay store; on a filesystem without
// user xattrs it refuses to open instead of losing opaque markers.
func TestUserxattrStore(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		scratch := fs.Scratch(t, "")
		if !storesUserXattrs(t, scratch) {
			_, err := graph.Open(filepath.Join(scratch, "store"), graph.Options{Create: true, Layout: layout, Userxattr: true, Features: features(t, fs)})
			if err == nil || !strings.Contains(err.Error(), "user xattrs") {
				t.Fatalf("userxattr store on %s without user xattrs: %v", fs.Name, err)
			}
			return
		}
		s := newStore(t, fs, layout, func(o *graph.Options) { o.Userxattr = true })
		must(t, s.Create(context.Background(), "one", ""))
		apply(t, s, "one", mkTar(t, dirE("d/"), file("d/x", "x"), file("z", "z")))
		must(t, s.Create(context.Background(), "two", "one"))
		apply(t, s, "two", mkTar(t, dirE("d/"), file("d/.wh..wh..opq", ""), file("d/y", "y"), file(".wh.z", "")))
		root := get(t, s, "two")
		equalList(t, "two", paths(t, root), []string{"/d", "/d/y"})
		if opts := mountOptions(t, root); !strings.Contains(opts, "userxattr") {
			t.Errorf("mount options %q lack userxattr", opts)
		}
		put(t, s, "two")
		equalList(t, "two tar", sorted(tarNames(t, s, "two")), []string{".wh.z", "d/", "d/.wh..wh..opq", "d/y"})
		equalList(t, "two changes", changes(t, s, "two"), []string{"C /d", "D /d/x", "A /d/y", "D /z"})
		must(t, s.CreateReadWrite(context.Background(), "ctr", "two"))
		p := get(t, s, "ctr")
		must(t, os.RemoveAll(filepath.Join(p, "d")))
		must(t, os.Mkdir(filepath.Join(p, "d"), 0o755))
		guestfs.Write(t, filepath.Join(p, "d/w"), "w", 0o644)
		put(t, s, "ctr")
		must(t, s.Create(context.Background(), "three", "two"))
		apply(t, s, "three", diffBytes(t, s, "ctr"))
		equalList(t, "three", paths(t, get(t, s, "three")), []string{"/d", "/d/w"})
		put(t, s, "three")
	})
}

// Group 12: a container layer mounted volatile keeps its writes across an
// unmount and a remount in the same boot (overlayfs leaves a mark in the
// work directory that makes it refuse the remount; the store clears it),
// and is refused once the boot it was mounted in is over.
func TestVolatileRemount(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout, func(o *graph.Options) { o.Volatile = true })
		must(t, s.Create(context.Background(), "img", ""))
		apply(t, s, "img", mkTar(t, file("f", "base")))
		must(t, s.CreateReadWrite(context.Background(), "c", "img"))
		p := get(t, s, "c")
		if opts := mountOptions(t, p); !strings.Contains(opts, "volatile") {
			t.Errorf("volatile store mounted a container layer with %q", opts)
		}
		must(t, os.WriteFile(filepath.Join(p, "new"), []byte("data"), 0o644))
		put(t, s, "c")
		p = get(t, s, "c")
		if b, err := os.ReadFile(filepath.Join(p, "new")); err != nil || string(b) != "data" {
			t.Errorf("after remount: %q, %v", b, err)
		}
		put(t, s, "c")

		// The image layer, a parent now, is mounted read-only, where
		// volatile means nothing.
		if p := get(t, s, "img"); strings.Contains(mountOptions(t, p), "volatile") {
			t.Error("read-only image layer mounted volatile")
		}
		put(t, s, "img")

		// As after a reboot: the recorded boot is another one.
		must(t, unix.Setxattr(filepath.Join(s.Home(), "layers", "c"), "trusted.ovlkit.volatile", []byte("an earlier boot"), 0))
		if _, err := s.Get(context.Background(), "c"); !errors.Is(err, graph.ErrVolatileLost) {
			t.Errorf("get after a reboot: %v, want ErrVolatileLost", err)
		}
	})
}
