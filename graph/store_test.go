package graph

import (
	"archive/tar"
	"bytes"
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
	"time"

	"github.com/ovlkit/ovlkit/layer"
	"github.com/ovlkit/ovlkit/ovl"
	"golang.org/x/sys/unix"
)

// hostFeatures stand in for the probe, which mounts and therefore only
// runs in the guest. Nothing in these tests mounts an overlay.
func hostFeatures() *ovl.Features {
	return &ovl.Features{DType: true, Whiteouts: true, Xattrs: true, Overlay: true, MultiLower: true, Notes: map[string]string{}}
}

func openTest(t *testing.T, home string, layout Layout) *Store {
	t.Helper()
	s, err := Open(home, Options{Create: true, Layout: layout, Sync: SyncNone, Features: hostFeatures()})
	if err != nil {
		t.Fatalf("open %s: %v", home, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestOpenRequiresInit(t *testing.T) {
	_, err := Open(t.TempDir(), Options{Features: hostFeatures()})
	if !errors.Is(err, ErrNoStore) {
		t.Fatalf("open without init: %v, want ErrNoStore", err)
	}
}

func TestLayoutRecorded(t *testing.T) {
	home := t.TempDir()
	s := openTest(t, home, LayoutHardlink)
	s.Close()
	s2, err := Open(home, Options{Features: hostFeatures()})
	if err != nil {
		t.Fatal(err)
	}
	if s2.Layout() != LayoutHardlink {
		t.Errorf("reopened layout %s, want hardlink", s2.Layout())
	}
	s2.Close()
	if _, err := Open(home, Options{Layout: LayoutOverlay, Features: hostFeatures()}); err == nil {
		t.Error("reopening a hardlink store as overlay succeeded")
	}
}

func TestOpenRefusesUnfitBackingFS(t *testing.T) {
	for _, c := range []struct {
		name string
		off  func(f *ovl.Features)
		opts Options
		want string
	}{
		{"d_type", func(f *ovl.Features) { f.DType = false }, Options{}, "d_type"},
		{"whiteouts", func(f *ovl.Features) { f.Whiteouts = false }, Options{}, "whiteouts"},
		{"trusted xattrs", func(f *ovl.Features) { f.Xattrs = false }, Options{}, "trusted.* xattrs"},
		{"overlay", func(f *ovl.Features) { f.Overlay = false }, Options{}, "overlay cannot mount"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := hostFeatures()
			c.off(f)
			opts := c.opts
			opts.Create, opts.Features = true, f
			existing := t.TempDir()
			_, err := Open(existing, opts)
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrUnfitFS) {
				t.Fatalf("open: %v, want ErrUnfitFS naming %q", err, c.want)
			}
			if ents, _ := os.ReadDir(existing); len(ents) != 0 {
				t.Errorf("refused Open left %d entries in the home it was given", len(ents))
			}
			if fds := openFilesBeneath(t, existing); len(fds) > 0 {
				t.Errorf("refused Open left files open: %v", fds)
			}
			missing := filepath.Join(t.TempDir(), "store")
			if _, err := Open(missing, opts); err == nil {
				t.Fatal("second open succeeded")
			}
			if _, err := os.Lstat(missing); !os.IsNotExist(err) {
				t.Errorf("refused Open left the home it made: %v", err)
			}
		})
	}
	// A userxattr store keeps its metadata in user.*, so it does not need
	// trusted.* from the backing filesystem.
	f := hostFeatures()
	f.Xattrs, f.Userxattr = false, true
	s, err := Open(t.TempDir(), Options{Create: true, Userxattr: true, Features: f})
	if err != nil {
		t.Fatalf("userxattr store without trusted xattrs: %v", err)
	}
	s.Close()
}

func TestFsyncStrictNeedsKernel(t *testing.T) {
	_, err := Open(t.TempDir(), Options{Create: true, FsyncStrict: true, Features: hostFeatures()})
	if err == nil || !strings.Contains(err.Error(), "fsync=strict") {
		t.Fatalf("fsync=strict without kernel support: %v", err)
	}
}

func TestCreateRemoveBasics(t *testing.T) {
	for _, layout := range []Layout{LayoutOverlay, LayoutHardlink} {
		t.Run(string(layout), func(t *testing.T) {
			s := openTest(t, t.TempDir(), layout)
			if err := s.Create(context.Background(), "base", ""); err != nil {
				t.Fatal(err)
			}
			if err := s.Create(context.Background(), "base", ""); !errors.Is(err, ErrExist) {
				t.Errorf("duplicate create: %v", err)
			}
			if err := s.Create(context.Background(), "orphan", "nope"); !errors.Is(err, ErrNotExist) {
				t.Errorf("create on missing parent: %v", err)
			}
			if err := s.CreateReadWrite(context.Background(), "c1", "base"); err != nil {
				t.Fatal(err)
			}
			if err := s.Remove(context.Background(), "base"); !errors.Is(err, ErrHasChildren) {
				t.Errorf("remove parent with child: %v", err)
			}
			if err := s.Remove(context.Background(), "missing"); !errors.Is(err, ErrNotExist) {
				t.Errorf("remove missing: %v", err)
			}
			if err := s.Create(context.Background(), "../x", ""); !errors.Is(err, ErrInvalidID) {
				t.Errorf("create ../x: %v", err)
			}
			li, err := s.Layer("c1")
			if err != nil {
				t.Fatal(err)
			}
			if li.Parent != "base" || !li.RW || li.Depth != 2 {
				t.Errorf("c1 info %+v", li)
			}
			if b, _ := s.Layer("base"); !b.Committed {
				t.Error("base not committed after a child was created")
			}
			if err := s.Remove(context.Background(), "c1"); err != nil {
				t.Fatal(err)
			}
			if err := s.Remove(context.Background(), "base"); err != nil {
				t.Fatal(err)
			}
			if s.Exists("base") || s.Exists("c1") {
				t.Error("removed layers still exist")
			}
			ents, _ := os.ReadDir(filepath.Join(s.Home(), "layers"))
			if len(ents) != 0 {
				t.Errorf("layers/ holds %d entries after removing all", len(ents))
			}
			ents, _ = os.ReadDir(filepath.Join(s.Home(), "l"))
			if len(ents) != 0 {
				t.Errorf("l/ holds %d entries after removing all", len(ents))
			}
			probs, err := s.Check()
			if err != nil || len(probs) != 0 {
				t.Errorf("check: %v %v", probs, err)
			}
		})
	}
}

func TestChildInheritsRootMode(t *testing.T) {
	s := openTest(t, t.TempDir(), LayoutOverlay)
	if err := s.Create(context.Background(), "a", ""); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(s.diffDir("a"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(s.diffDir("a"), 7, 8); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(context.Background(), "b", "a"); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(s.diffDir("b"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("child diff root mode %v, want 0700", fi.Mode().Perm())
	}
}

// The deepest chain overlayfs mounts is 500 layers; the 501st fails at
// Create with the limit in the message rather than with EINVAL at mount.
func TestDepthLimitAtCreate(t *testing.T) {
	// A home path of 200 characters: the limit must not depend on it.
	home := filepath.Join(t.TempDir(), strings.Repeat("h", 200))
	s := openTest(t, home, LayoutOverlay)
	parent := ""
	for i := 1; i <= ovl.MaxLowers; i++ {
		id := fmt.Sprintf("layer-%03d-%s", i, strings.Repeat("x", 100))
		if err := s.Create(context.Background(), id, parent); err != nil {
			t.Fatalf("layer %d: %v", i, err)
		}
		parent = id
	}
	err := s.Create(context.Background(), "one-too-many", parent)
	if !errors.Is(err, ErrTooDeep) {
		t.Fatalf("layer 501: %v, want ErrTooDeep", err)
	}
	if !strings.Contains(err.Error(), "501") || !strings.Contains(err.Error(), "500") {
		t.Errorf("error does not name the depth and limit: %v", err)
	}
	if err := s.CreateReadWrite(context.Background(), "rw-too-many", parent); !errors.Is(err, ErrTooDeep) {
		t.Errorf("rw layer 501: %v, want ErrTooDeep", err)
	}
	// Both mounts of the 500th layer fit in a page when relative to l/.
	err = s.view(context.Background(), func(st *state) error {
		for _, committed := range []bool{false, true} {
			st.Layers[parent].Committed = committed
			cfg, _, err := s.mountConfig(st, parent)
			if err != nil {
				return err
			}
			p, err := cfg.LegacyPlan(4096)
			if err != nil {
				return err
			}
			if p.Dir != filepath.Join(home, "l") {
				return fmt.Errorf("500-layer mount planned from %q", p.Dir)
			}
		}
		st.Layers[parent].Committed = false
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestHardlinkLayoutHasNoDepthLimit(t *testing.T) {
	s := openTest(t, t.TempDir(), LayoutHardlink)
	if err := s.view(context.Background(), func(st *state) error {
		parent := ""
		for i := 0; i < ovl.MaxLowers+1; i++ {
			id := fmt.Sprintf("l%d", i)
			st.Layers[id] = &layerRecord{Parent: parent, Link: fmt.Sprintf("%06d", i), Depth: i + 1}
			parent = id
		}
		if err := s.checkDepth(st, "next", parent, false); err != nil {
			return err
		}
		for i := 0; i < ovl.MaxLowers+1; i++ {
			delete(st.Layers, fmt.Sprintf("l%d", i))
		}
		return nil
	}); err != nil {
		t.Fatalf("hardlink layout at depth 502: %v", err)
	}
}

func TestRecoveryOnOpen(t *testing.T) {
	home := t.TempDir()
	s := openTest(t, home, LayoutOverlay)
	if err := s.Create(context.Background(), "a", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(context.Background(), "b", "a"); err != nil {
		t.Fatal(err)
	}
	la, _ := s.Layer("a")
	s.Close()

	// A crash leaves: a staged layer, a layer directory without record,
	// a lost link, a stray link, and a mount count nobody holds.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(home, "staging", "create-x-123", "layer", "diff"), 0o755))
	must(os.MkdirAll(filepath.Join(home, "layers", "ghost", "diff"), 0o755))
	must(os.Remove(filepath.Join(home, "l", la.Link)))
	must(os.Symlink("../layers/ghost/diff", filepath.Join(home, "l", "ZZZZZZ")))
	must(os.WriteFile(filepath.Join(home, ".state-123"), []byte("{"), 0o600))
	must(unix.Setxattr(filepath.Join(home, "layers", "b"), "trusted."+mountsXattr, []byte("3 rw"), 0))

	s2 := openTest(t, home, "")
	probs, err := s2.Check()
	if err != nil || len(probs) != 0 {
		t.Fatalf("after recovery: %v %v", probs, err)
	}
	if _, err := os.Stat(filepath.Join(home, "layers", "ghost")); !os.IsNotExist(err) {
		t.Error("unrecorded layer directory survived")
	}
	if ents, _ := os.ReadDir(filepath.Join(home, "staging")); len(ents) != 0 {
		t.Errorf("staging holds %d entries", len(ents))
	}
	if _, err := os.Stat(filepath.Join(home, ".state-123")); !os.IsNotExist(err) {
		t.Error("the new file of a crashed compaction survived")
	}
	if got, err := os.Readlink(filepath.Join(home, "l", la.Link)); err != nil || got != "../layers/a/diff" {
		t.Errorf("lost link not rebuilt: %q %v", got, err)
	}
	if m, err := s2.recordedMounts("b"); err != nil || m.Refs != 0 {
		t.Errorf("stale mount count %d survived (%v)", m.Refs, err)
	}
}

func TestRecoveryReplacesSymlinkedLinkDir(t *testing.T) {
	home := t.TempDir()
	s := openTest(t, home, LayoutOverlay)
	if err := s.Create(context.Background(), "a", ""); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := os.RemoveAll(filepath.Join(home, "l")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("layers", filepath.Join(home, "l")); err != nil {
		t.Fatal(err)
	}
	s2 := openTest(t, home, "")
	if probs, err := s2.Check(); err != nil || len(probs) != 0 {
		t.Fatalf("after recovery: %v %v", probs, err)
	}
}

func TestCheckFindsDamage(t *testing.T) {
	s := openTest(t, t.TempDir(), LayoutOverlay)
	if err := s.Create(context.Background(), "a", ""); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(s.workDir("a")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(s.Home(), "layers", "stray"), 0o755); err != nil {
		t.Fatal(err)
	}
	probs, err := s.Check()
	if err != nil {
		t.Fatal(err)
	}
	text := Summary(probs)
	for _, want := range []string{"a: missing directory", "layers/stray has no record"} {
		if !strings.Contains(text, want) {
			t.Errorf("check output lacks %q:\n%s", want, text)
		}
	}
}

func TestStateRejectsDamage(t *testing.T) {
	for name, in := range map[string]string{
		"garbage":      "{",
		"version":      `{"version":9,"layout":"overlay"}`,
		"layout":       `{"version":1,"layout":"zfs"}`,
		"null record":  `{"version":1,"layout":"overlay","layers":{"a":null}}`,
		"bad layer id": `{"version":1,"layout":"overlay","layers":{"../x":{"link":"AAAAAA"}}}`,
	} {
		if _, err := decodeState([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	st, err := decodeState([]byte(`{"version":1,"layout":"hardlink","layers":{"a":{"link":"AAAAAA","depth":1}}}`))
	if err != nil || st.Layout != LayoutHardlink || st.Layers["a"].Link != "AAAAAA" {
		t.Errorf("valid state: %+v %v", st, err)
	}
}

func TestStateChainDetectsCycle(t *testing.T) {
	st := newState(LayoutOverlay, fixedTime)
	st.Layers["a"] = &layerRecord{Parent: "b"}
	st.Layers["b"] = &layerRecord{Parent: "a"}
	if _, err := st.chain("a"); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Errorf("cycle: %v", err)
	}
}

func TestLinkNames(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 200; i++ {
		l, err := newLink(func(s string) bool { return seen[s] })
		if err != nil {
			t.Fatal(err)
		}
		if !validLink(l) {
			t.Fatalf("invalid link %q", l)
		}
		if seen[l] {
			t.Fatalf("duplicate link %q", l)
		}
		seen[l] = true
	}
	if _, err := newLink(func(string) bool { return true }); err == nil {
		t.Error("newLink succeeded with every name taken")
	}
	for _, bad := range []string{"", "abcdef", "ABCDE", "ABCDEFG", "ABC/EF"} {
		if validLink(bad) {
			t.Errorf("validLink(%q)", bad)
		}
	}
}

func TestConcurrentCreateRemove(t *testing.T) {
	s := openTest(t, t.TempDir(), LayoutOverlay)
	if err := s.Create(context.Background(), "base", ""); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 8; i++ {
				id := fmt.Sprintf("g%d-%d", g, i)
				if err := s.Create(context.Background(), id, "base"); err != nil {
					errs <- err
					return
				}
				if i%2 == 0 {
					if err := s.Remove(context.Background(), id); err != nil {
						errs <- err
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	ls, err := s.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1+8*4 {
		t.Errorf("%d layers, want %d", len(ls), 1+8*4)
	}
	if probs, err := s.Check(); err != nil || len(probs) != 0 {
		t.Errorf("check: %v %v", probs, err)
	}
}

// helperEnv makes the test binary act as a second process creating
// layers in the same store.
const helperEnv = "OVLKIT_GRAPH_HELPER_HOME"

func TestMain(m *testing.M) {
	if home := os.Getenv(applyHelperEnv); home != "" {
		os.Exit(applyHelper(home))
	}
	if home := os.Getenv(helperEnv); home != "" {
		os.Exit(helperProcess(home, os.Getenv("OVLKIT_GRAPH_HELPER_PREFIX")))
	}
	if home := os.Getenv(refsHelperEnv); home != "" {
		os.Exit(refsHelper(home, os.Getenv("OVLKIT_GRAPH_HELPER_PREFIX")))
	}
	os.Exit(m.Run())
}

func helperProcess(home, prefix string) int {
	s, err := Open(home, Options{Sync: SyncNone, Features: hostFeatures()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Close()
	for i := 0; i < 40; i++ {
		if err := s.Create(context.Background(), fmt.Sprintf("%s-%d", prefix, i), "base"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return 0
}

// Two processes creating layers at once: the lock file must keep every
// record (a lost update would drop layers from the state file).
func TestTwoProcesses(t *testing.T) {
	home := t.TempDir()
	s := openTest(t, home, LayoutOverlay)
	if err := s.Create(context.Background(), "base", ""); err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for _, p := range []string{"p1", "p2"} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.Env = append(os.Environ(), helperEnv+"="+home, "OVLKIT_GRAPH_HELPER_PREFIX="+p)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, &out)
	}
	// This process creates too, concurrently.
	for i := 0; i < 40; i++ {
		if err := s.Create(context.Background(), fmt.Sprintf("p0-%d", i), "base"); err != nil {
			t.Fatal(err)
		}
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper %d: %v: %s", i, err, outs[i])
		}
	}
	ls, err := s.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1+3*40 {
		t.Fatalf("%d layers after 3 processes created 120, want 121", len(ls))
	}
	if probs, err := s.Check(); err != nil || len(probs) != 0 {
		t.Errorf("check: %v %v", probs, err)
	}
}

func tarOf(t *testing.T, entries ...tar.Header) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		h := h
		body := ""
		if h.Typeflag == tar.TypeReg {
			body = h.Linkname
			h.Linkname = ""
			h.Size = int64(len(body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if body != "" {
			if _, err := tw.Write([]byte(body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

func reg(name, body string) tar.Header {
	return tar.Header{Name: name, Typeflag: tar.TypeReg, Linkname: body}
}

func dir(name string) tar.Header { return tar.Header{Name: name, Typeflag: tar.TypeDir} }

// ApplyDiff on the host exercises staging and publication; the tar code
// itself is tested in package layer.
func TestApplyDiffPublishesAtomically(t *testing.T) {
	for _, layout := range []Layout{LayoutOverlay, LayoutHardlink} {
		t.Run(string(layout), func(t *testing.T) {
			s := openTest(t, t.TempDir(), layout)
			ctx := context.Background()
			if err := s.Create(context.Background(), "base", ""); err != nil {
				t.Fatal(err)
			}
			n, err := s.ApplyDiff(ctx, "base", tarOf(t, dir("etc/"), reg("etc/hosts", "127.0.0.1 localhost\n"), reg("keep", "k")))
			if err != nil {
				t.Fatal(err)
			}
			if n != int64(len("127.0.0.1 localhost\n")+1) {
				t.Errorf("applied %d bytes", n)
			}
			if _, err := s.ApplyDiff(ctx, "base", tarOf(t, reg("x", "y"))); !errors.Is(err, ErrNotEmpty) {
				t.Errorf("second apply: %v, want ErrNotEmpty", err)
			}
			if size, err := s.DiffSize("base"); err != nil || size != n {
				t.Errorf("DiffSize %d %v, want %d", size, err, n)
			}
			if err := s.Create(context.Background(), "broken", "base"); err != nil {
				t.Fatal(err)
			}
			// A truncated tar fails and leaves no trace of the half layer.
			full := tarOf(t, reg("a", strings.Repeat("a", 4096)), reg("b", "b")).Bytes()
			if _, err := s.ApplyDiff(ctx, "broken", bytes.NewReader(full[:1000])); err == nil {
				t.Fatal("truncated tar applied")
			}
			if empty, err := dirEmpty(s.diffDir("broken")); err != nil || !empty {
				t.Errorf("diff of failed apply not empty: %v %v", empty, err)
			}
			if ents, _ := os.ReadDir(filepath.Join(s.Home(), "staging")); len(ents) != 0 {
				t.Errorf("staging holds %d entries after a failed apply", len(ents))
			}
			if err := s.Create(context.Background(), "child", "base"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.ApplyDiff(ctx, "child", tarOf(t, reg(".wh.keep", ""), reg("etc/hosts", "changed\n"))); err != nil {
				t.Fatal(err)
			}
			ch, err := s.Changes(ctx, "child")
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range ch {
				got = append(got, c.String())
			}
			want := "C /etc,C /etc/hosts,D /keep"
			if strings.Join(got, ",") != want {
				t.Errorf("changes %v, want %s", got, want)
			}
			if layout == LayoutHardlink {
				root := s.rootDir("child")
				if b, err := os.ReadFile(filepath.Join(root, "etc/hosts")); err != nil || string(b) != "changed\n" {
					t.Errorf("hardlink root etc/hosts = %q %v", b, err)
				}
				if _, err := os.Lstat(filepath.Join(root, "keep")); !os.IsNotExist(err) {
					t.Errorf("whited-out file in hardlink root: %v", err)
				}
				var a, b2 os.FileInfo
				a, _ = os.Stat(filepath.Join(s.rootDir("base"), "etc"))
				b2, _ = os.Stat(filepath.Join(root, "etc"))
				if os.SameFile(a, b2) {
					t.Error("directories shared between hardlink roots")
				}
			}
			if probs, err := s.Check(); err != nil || len(probs) != 0 {
				t.Errorf("check: %v %v", probs, err)
			}
		})
	}
}

func TestBootIDStable(t *testing.T) {
	a, err := bootID()
	if err != nil {
		t.Fatal(err)
	}
	b, err := bootID()
	if err != nil || a != b || a == "" {
		t.Fatalf("boot id %q then %q (%v)", a, b, err)
	}
}

func TestUserxattrRecorded(t *testing.T) {
	home := t.TempDir()
	f := hostFeatures()
	f.Userxattr = true
	s, err := Open(home, Options{Create: true, Userxattr: true, Sync: SyncNone, Features: f})
	if err != nil {
		t.Fatal(err)
	}
	if s.whiteouts() != layer.OverlayUserWhiteouts {
		t.Error("userxattr store does not use user.overlay whiteouts")
	}
	if err := s.Create(context.Background(), "a", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(context.Background(), "b", "a"); err != nil {
		t.Fatal(err)
	}
	err = s.view(context.Background(), func(st *state) error {
		for _, id := range []string{"a", "b"} {
			cfg, _, err := s.mountConfig(st, id)
			if err != nil {
				return err
			}
			if !strings.Contains(strings.Join(cfg.Options, ","), "userxattr") {
				return fmt.Errorf("%s mounts with %v", id, cfg.Options)
			}
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	s.Close()
	if _, err := Open(home, Options{Features: hostFeatures()}); err == nil {
		t.Error("opened a userxattr store on a kernel without userxattr")
	}
	plain := t.TempDir()
	s2, err := Open(plain, Options{Create: true, Features: f})
	if err != nil {
		t.Fatal(err)
	}
	s2.Close()
	if _, err := Open(plain, Options{Userxattr: true, Features: f}); err == nil {
		t.Error("opened a trusted.overlay store as userxattr")
	}
}

const applyHelperEnv = "OVLKIT_GRAPH_APPLY_HOME"

// applyHelper applies the tar on its stdin to layer "victim"; the test
// kills it half way.
func applyHelper(home string) int {
	s, err := Open(home, Options{Features: hostFeatures()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := s.ApplyDiff(context.Background(), "victim", os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// A process killed with SIGKILL in the middle of ApplyDiff leaves no
// trace once the store is opened again: the layer is empty, staging is
// clean and Check finds nothing.
func TestKilledApplyLeavesNoTrace(t *testing.T) {
	home := t.TempDir()
	s := openTest(t, home, LayoutOverlay)
	if err := s.Create(context.Background(), "victim", ""); err != nil {
		t.Fatal(err)
	}
	s.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), applyHelperEnv+"="+home)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var entries []tar.Header
	for i := 0; i < 200; i++ {
		entries = append(entries, reg(fmt.Sprintf("f%03d", i), strings.Repeat("x", 4096)))
	}
	full := tarOf(t, entries...).Bytes()
	if _, err := stdin.Write(full[:len(full)/2]); err != nil {
		t.Fatalf("feed helper: %v (%s)", err, stderr.String())
	}
	// Wait until the helper has staged files, then kill it mid-apply.
	deadline := time.Now().Add(20 * time.Second)
	for {
		ents, _ := filepath.Glob(filepath.Join(home, "staging", "apply-*", "layer", "diff", "f*"))
		if len(ents) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("helper never staged anything: %s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	stdin.Close()

	if ents, _ := os.ReadDir(filepath.Join(home, "staging")); len(ents) == 0 {
		t.Fatal("the killed apply left no staging directory; the test proves nothing")
	}
	s2 := openTest(t, home, "")
	if ents, _ := os.ReadDir(filepath.Join(home, "staging")); len(ents) != 0 {
		t.Errorf("staging holds %d entries after recovery", len(ents))
	}
	if empty, err := dirEmpty(s2.diffDir("victim")); err != nil || !empty {
		t.Errorf("victim diff not empty after a killed apply: %v %v", empty, err)
	}
	if probs, err := s2.Check(); err != nil || len(probs) != 0 {
		t.Errorf("check: %v %v", probs, err)
	}
	// The layer is usable: a complete apply now succeeds.
	if _, err := s2.ApplyDiff(context.Background(), "victim", bytes.NewReader(full)); err != nil {
		t.Fatal(err)
	}
}

func TestMountRecordCodec(t *testing.T) {
	for _, m := range []mountRecord{{Refs: 1}, {Refs: 2, ReadOnly: true}, {Refs: 1000}} {
		got, err := decodeMountRecord(m.encode())
		if err != nil || got != m {
			t.Errorf("%+v: round trip gave %+v, %v", m, got, err)
		}
	}
	for _, bad := range []string{"", "3", "-1 rw", "x rw", "2 rx", "2 rw extra", "99999999999999999999 rw"} {
		if _, err := decodeMountRecord([]byte(bad)); err == nil {
			t.Errorf("%q: decoded without error", bad)
		}
	}
}

// openFilesBeneath lists what this process holds open below dir; an open
// file keeps the filesystem from being unmounted.
func openFilesBeneath(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if p, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(p, dir+"/") {
			out = append(out, p)
		}
	}
	return out
}
