//go:build ovlkit_guest

package graphsuite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/ovl"
	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// Group 1: an empty layer mounts as an empty 0755 root:root directory,
// and is gone after Remove.
func TestCreateEmpty(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout)
		must(t, s.Create(context.Background(), "empty", ""))
		if !s.Exists("empty") {
			t.Fatal("Exists(empty) = false after Create")
		}
		p := get(t, s, "empty")
		var st unix.Stat_t
		must(t, unix.Stat(p, &st))
		if st.Mode&0o7777 != 0o755 || st.Uid != 0 || st.Gid != 0 {
			t.Errorf("empty root mode %o owner %d:%d, want 755 0:0", st.Mode&0o7777, st.Uid, st.Gid)
		}
		if ents, err := os.ReadDir(p); err != nil || len(ents) != 0 {
			t.Errorf("empty layer lists %d entries (%v)", len(ents), err)
		}
		put(t, s, "empty")
		must(t, s.Remove(context.Background(), "empty"))
		if s.Exists("empty") {
			t.Error("Exists(empty) after Remove")
		}
		if err := s.Remove(context.Background(), "empty"); !errors.Is(err, graph.ErrNotExist) {
			t.Errorf("second Remove: %v, want ErrNotExist", err)
		}
		if _, err := s.Get(context.Background(), "empty"); !errors.Is(err, graph.ErrNotExist) {
			t.Errorf("Get after Remove: %v", err)
		}
	})
}

type meta struct {
	mode     uint32
	uid, gid uint32
}

func statMeta(t *testing.T, p string) meta {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(p, &st))
	return meta{st.Mode, st.Uid, st.Gid}
}

// Group 1: CreateBase writes a sticky directory owned 1:2 and a setuid
// file through a container layer; CreateSnap sees both unchanged; a chmod
// of the root is inherited by a grandchild.
func TestCreateBaseSnap(t *testing.T) {
	old := unix.Umask(0)
	defer unix.Umask(old)
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout)
		must(t, s.CreateReadWrite(context.Background(), "Base", ""))
		p := get(t, s, "Base")
		must(t, os.Mkdir(filepath.Join(p, "a subdir"), 0o705|os.ModeSticky))
		must(t, unix.Chmod(filepath.Join(p, "a subdir"), 0o705|unix.S_ISVTX))
		must(t, os.Lchown(filepath.Join(p, "a subdir"), 1, 2))
		must(t, os.WriteFile(filepath.Join(p, "a file"), []byte("Some data"), 0o222))
		must(t, unix.Chmod(filepath.Join(p, "a file"), 0o222|unix.S_ISUID))
		check := func(root string) {
			t.Helper()
			d := statMeta(t, filepath.Join(root, "a subdir"))
			if d.mode != unix.S_IFDIR|0o705|unix.S_ISVTX || d.uid != 1 || d.gid != 2 {
				t.Errorf("a subdir: mode %o owner %d:%d", d.mode, d.uid, d.gid)
			}
			f := statMeta(t, filepath.Join(root, "a file"))
			if f.mode != unix.S_IFREG|0o222|unix.S_ISUID || f.uid != 0 || f.gid != 0 {
				t.Errorf("a file: mode %o owner %d:%d", f.mode, f.uid, f.gid)
			}
			b, err := os.ReadFile(filepath.Join(root, "a file"))
			if err != nil || string(b) != "Some data" {
				t.Errorf("a file content %q %v", b, err)
			}
			if ents, _ := os.ReadDir(root); len(ents) != 2 {
				t.Errorf("%d entries, want 2", len(ents))
			}
		}
		check(p)
		put(t, s, "Base")

		must(t, s.Create(context.Background(), "Snap", "Base"))
		check(get(t, s, "Snap"))
		put(t, s, "Snap")

		// Root-mode inheritance (containers/storage CreateSnap).
		must(t, s.CreateReadWrite(context.Background(), "Snap2", "Snap"))
		p2 := get(t, s, "Snap2")
		must(t, os.Chmod(p2, 0o700))
		put(t, s, "Snap2")
		must(t, s.Create(context.Background(), "Snap3", "Snap2"))
		p3 := get(t, s, "Snap3")
		if m := statMeta(t, p3); m.mode&0o7777 != 0o700 {
			t.Errorf("grandchild root mode %o, want 700", m.mode&0o7777)
		}
		check(p3)
		put(t, s, "Snap3")

		ls, err := s.Layers()
		must(t, err)
		var ids []string
		for _, l := range ls {
			ids = append(ids, l.ID)
		}
		equalList(t, "layers", ids, []string{"Base", "Snap", "Snap2", "Snap3"})
		if err := s.Remove(context.Background(), "Base"); !errors.Is(err, graph.ErrHasChildren) {
			t.Errorf("remove Base with children: %v", err)
		}
		for _, id := range []string{"Snap3", "Snap2", "Snap", "Base"} {
			must(t, s.Remove(context.Background(), id))
		}
	})
}

// deepChain creates a chain of n layers and returns the top. Most layers
// are empty, which is what makes 500 of them affordable under emulation;
// the base holds testfile.txt, and every layer whose index is a multiple
// of every, and the two topmost, hold top-id and
// layer-i/{layer-id,parent-id}.
func deepChain(t *testing.T, s *graph.Store, n, every int) string {
	t.Helper()
	must(t, s.Create(context.Background(), "base", ""))
	apply(t, s, "base", mkTar(t, file("testfile.txt", "base")))
	parent := "base"
	for i := 1; i < n; i++ {
		id := fmt.Sprintf("layer-%03d", i)
		must(t, s.Create(context.Background(), id, parent))
		if hasContent(i, n, every) {
			apply(t, s, id, mkTar(t,
				file("top-id", id),
				dirE(fmt.Sprintf("layer-%d/", i)),
				file(fmt.Sprintf("layer-%d/layer-id", i), id),
				file(fmt.Sprintf("layer-%d/parent-id", i), parent)))
		}
		parent = id
	}
	return parent
}

func hasContent(i, n, every int) bool { return i%every == 0 || i >= n-2 }

// checkDeep verifies the view of layer upto of a deepChain(n, every).
func checkDeep(t *testing.T, root string, n, every, upto int) {
	t.Helper()
	top := fmt.Sprintf("layer-%03d", upto)
	b, err := os.ReadFile(filepath.Join(root, "testfile.txt"))
	if err != nil || string(b) != "base" {
		t.Fatalf("base file through %d layers: %q %v", n, b, err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "top-id")); string(b) != top {
		t.Errorf("top-id %q, want %q", b, top)
	}
	for i := 1; i <= upto; i++ {
		_, err := os.Stat(filepath.Join(root, fmt.Sprintf("layer-%d", i)))
		if !hasContent(i, n, every) {
			if err == nil {
				t.Errorf("layer-%d present though that layer is empty", i)
			}
			continue
		}
		id := fmt.Sprintf("layer-%03d", i)
		b, err := os.ReadFile(filepath.Join(root, fmt.Sprintf("layer-%d/layer-id", i)))
		if err != nil || string(b) != id {
			t.Fatalf("layer-%d/layer-id %q %v", i, b, err)
		}
	}
}

// Group 2: 128 layers on both layouts; a container layer on top sees the
// whole chain.
func TestDeepLayerRead128(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout, noSync)
		top := deepChain(t, s, 128, 8)
		must(t, s.CreateReadWrite(context.Background(), "container", top))
		checkDeep(t, get(t, s, "container"), 128, 8, 127)
		put(t, s, "container")
		checkDeep(t, get(t, s, top), 128, 8, 127) // committed: read-only, 128 lowers
		put(t, s, top)
	})
}

// Groups 2 and 3: 500 layers under a 200-character home path mount on
// 6.1 (short links, relative mount data); the 501st fails at Create with
// the limit, not with EINVAL from mount.
func TestDeepLayerRead500(t *testing.T) {
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		home := filepath.Join(fs.Scratch(t, ""), strings.Repeat("h", 200))
		s, err := graph.Open(home, graph.Options{Create: true, Layout: graph.LayoutOverlay, Sync: graph.SyncNone, Features: features(t, fs)})
		must(t, err)
		t.Cleanup(func() { s.Cleanup(); s.Close() })
		top := deepChain(t, s, ovl.MaxLowers, 50)
		// The 500th layer mounts with its diff as upper over 499 lowers.
		checkDeep(t, get(t, s, top), ovl.MaxLowers, 50, ovl.MaxLowers-1)
		p := filepath.Join(get(t, s, top), "written-on-top")
		must(t, os.WriteFile(p, []byte("x"), 0o644))
		put(t, s, top)
		put(t, s, top)
		err = s.Create(context.Background(), "layer-501", top)
		if !errors.Is(err, graph.ErrTooDeep) || !strings.Contains(err.Error(), "501") {
			t.Fatalf("501st layer: %v, want ErrTooDeep naming 501", err)
		}
		if err := s.CreateReadWrite(context.Background(), "container-501", top); !errors.Is(err, graph.ErrTooDeep) {
			t.Fatalf("501st container layer: %v, want ErrTooDeep", err)
		}
		if s.Exists("layer-501") {
			t.Error("refused layer exists")
		}
		// Layer 499 is committed now and mounts read-only over 499 lowers.
		mid := fmt.Sprintf("layer-%03d", ovl.MaxLowers-2)
		checkDeep(t, get(t, s, mid), ovl.MaxLowers, 50, ovl.MaxLowers-2)
		put(t, s, mid)
		if probs, err := s.Check(); err != nil || len(probs) != 0 {
			t.Errorf("check: %v %v", probs, err)
		}
	})
}

// Group 3: mount data of exactly 4095 bytes mounts with absolute paths,
// 4096 bytes needs the relative form, and both mount.
func TestMountDataBoundary(t *testing.T) {
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		base := fs.Scratch(t, "")
		for _, size := range []int{4095, 4096} {
			l := guesttest.NewLayers(t, filepath.Join(base, fmt.Sprint(size)), 2)
			cfg := ovl.Config{Lower: l.Lower, Upper: l.Upper, Work: l.Work, Base: "/"}
			// Lengthen the second lower with nested directories (a name
			// may not exceed 255 bytes) until the data has exactly size
			// bytes.
			need := size - len(cfg.Data()) - 1
			if need < 1 {
				t.Fatalf("base data already %d bytes", len(cfg.Data()))
			}
			var segs []string
			for need > 0 {
				n := need
				if n > 255 {
					n = min(200, need-2)
					need-- // the separator
				}
				segs = append(segs, strings.Repeat("p", n))
				need -= n
			}
			long := filepath.Join(append([]string{l.Lower[1]}, segs...)...)
			must(t, os.MkdirAll(long, 0o755))
			cfg.Lower[1] = long
			if n := len(cfg.Data()); n != size {
				t.Fatalf("built %d bytes of mount data, want %d", n, size)
			}
			m := ovl.Mounter{}
			method, err := m.Method(cfg)
			must(t, err)
			want := map[int]string{4095: "absolute", 4096: "relative"}[size]
			if method != want {
				t.Errorf("%d bytes: method %s, want %s", size, method, want)
			}
			must(t, m.Mount(l.Merged, cfg, false))
			must(t, ovl.Unmount(l.Merged, false))
		}
	})
}

// Group 12: Get twice, Put once keeps the mount; Put to zero unmounts;
// one Put too many is an error.
func TestRefcount(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout)
		mountableLayer(t, s, "c")
		p1 := get(t, s, "c")
		p2 := get(t, s, "c")
		if p1 != p2 {
			t.Fatalf("two Gets gave %s and %s", p1, p2)
		}
		put(t, s, "c")
		wantMounted(t, p1, true, "after one of two Puts")
		put(t, s, "c")
		wantMounted(t, p1, false, "after the last Put")
		if err := s.Put(context.Background(), "c"); !errors.Is(err, graph.ErrNotMounted) {
			t.Errorf("extra Put: %v, want ErrNotMounted", err)
		}
	})
}

// Group 12: concurrent Get/Put from many goroutines ends unmounted with a
// zero count, and every Get saw a mounted layer.
func TestConcurrentGetPut(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout, noSync)
		must(t, s.Create(context.Background(), "img", ""))
		apply(t, s, "img", mkTar(t, file("f", "content")))
		var wg sync.WaitGroup
		errs := make(chan error, 100)
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 10; i++ {
					p, err := s.Get(context.Background(), "img")
					if err != nil {
						errs <- err
						return
					}
					if b, err := os.ReadFile(filepath.Join(p, "f")); err != nil || string(b) != "content" {
						errs <- fmt.Errorf("read through mount: %q %v", b, err)
					}
					if err := s.Put(context.Background(), "img"); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		li, err := s.Layer("img")
		must(t, err)
		if li.Mounts != 0 {
			t.Errorf("mount count %d after balanced Get/Put", li.Mounts)
		}
		if probs, err := s.Check(); err != nil || len(probs) != 0 {
			t.Errorf("check: %v %v", probs, err)
		}
	})
}

// Group 12: a parent that got a child is mounted read-only from then on
// (moby #39780: the kernel refuses a lower that is another mount's upper).
func TestParentWithChildrenIsReadOnly(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout)
		must(t, s.CreateReadWrite(context.Background(), "parent", ""))
		p := get(t, s, "parent")
		guestfs.Write(t, filepath.Join(p, "f"), "x", 0o644)
		if err := s.CreateReadWrite(context.Background(), "child", "parent"); !errors.Is(err, graph.ErrMounted) {
			t.Errorf("child of a read-write mounted parent: %v, want ErrMounted", err)
		}
		put(t, s, "parent")
		must(t, s.CreateReadWrite(context.Background(), "child", "parent"))
		p = get(t, s, "parent")
		err := os.WriteFile(filepath.Join(p, "g"), []byte("y"), 0o644)
		if !isErrno(err, unix.EROFS) {
			t.Errorf("write into a parent with children: %v, want EROFS", err)
		}
		c := get(t, s, "child")
		if b, err := os.ReadFile(filepath.Join(c, "f")); err != nil || string(b) != "x" {
			t.Errorf("child sees %q %v", b, err)
		}
		put(t, s, "child")
		put(t, s, "parent")
	})
}

// holder starts a process in a new mount namespace, which gets a copy of
// every mount at that moment, as a container runtime's would.
func holder(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "read x")
	if _, err := os.Stat("/bin/sh"); err != nil {
		cmd = exec.Command(os.Args[0], "-test.run=^$", "-test.timeout=1h")
		cmd.Env = append(os.Environ(), "OVLKIT_GRAPH_HOLD=1")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	stdin, err := cmd.StdinPipe()
	must(t, err)
	must(t, cmd.Start())
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

func TestMain(m *testing.M) {
	if os.Getenv("OVLKIT_GRAPH_HOLD") != "" {
		// Block until the test closes stdin or kills us.
		buf := make([]byte, 1)
		os.Stdin.Read(buf)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func mountedIn(t *testing.T, pid int, path string) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	must(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && ovl.UnescapeMountField(f[4]) == path {
			return true
		}
	}
	return false
}

// Group 12, the leak test (moby #34672, PR #34948): a process in another
// mount namespace holds a copy of the layer's mount. Put must drop that
// copy too, and Remove, re-create and Get of the same ID must not fail
// with EBUSY.
func TestMountLeakToNamespace(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout)
		mountableLayer(t, s, "c")
		p := get(t, s, "c")
		guestfs.Write(t, filepath.Join(p, "data"), "v1", 0o644)
		h := holder(t)
		// Wait until the namespace exists: its mountinfo shows the copy.
		deadline := 200
		for !mountedIn(t, h.Process.Pid, p) {
			if deadline--; deadline == 0 {
				t.Fatal("holder never showed the mount")
			}
			unix.Nanosleep(&unix.Timespec{Nsec: 10e6}, nil)
		}
		put(t, s, "c")
		if mountedIn(t, h.Process.Pid, p) {
			t.Error("the other namespace still holds the mount after Put")
		}
		must(t, s.Remove(context.Background(), "c"))
		must(t, s.CreateReadWrite(context.Background(), "c", "c-base"))
		p = get(t, s, "c")
		guestfs.Write(t, filepath.Join(p, "data"), "v2", 0o644)
		put(t, s, "c")
	})
}

// Group 12: two stores opened on one home (as two processes would) share
// the reference count, which lives with the layer, not in either process.
func TestRefcountAcrossStores(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s1 := newStore(t, fs, layout)
		s2, err := graph.Open(s1.Home(), graph.Options{Features: features(t, fs)})
		must(t, err)
		defer s2.Close()
		mountableLayer(t, s1, "c")
		p := get(t, s1, "c")
		get(t, s2, "c")
		li, err := s2.Layer("c")
		must(t, err)
		if li.Mounts != 2 {
			t.Errorf("mount count %d after a Get in each store, want 2", li.Mounts)
		}
		put(t, s1, "c")
		wantMounted(t, p, true, "while the other store holds a reference")
		put(t, s2, "c")
		wantMounted(t, p, false, "after both references were dropped")
		if err := s1.Remove(context.Background(), "c"); err != nil {
			t.Errorf("remove after the last Put: %v", err)
		}
	})
}

// mountableLayer makes a container layer id on an empty image layer
// id-base: Get mounts it, where a layer without a parent is handed out as
// its diff directory (see TestGetWithoutParent).
func mountableLayer(t *testing.T, s *graph.Store, id string) {
	t.Helper()
	must(t, s.Create(context.Background(), id+"-base", ""))
	must(t, s.CreateReadWrite(context.Background(), id, id+"-base"))
}

// wantMounted fails the test unless path is (or is not) an overlay mount.
func wantMounted(t *testing.T, path string, want bool, when string) {
	t.Helper()
	if ok, _ := ovl.IsOverlay(path); ok != want {
		t.Fatalf("mounted=%v %s, want %v", ok, when, want)
	}
}
