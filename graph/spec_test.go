package graph

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ovlkit/ovlkit/ovl"
	"golang.org/x/sys/unix"
)

func openWith(t *testing.T, home string, opts Options) *Store {
	t.Helper()
	if opts.Features == nil {
		opts.Features = hostFeatures()
	}
	opts.Create, opts.Sync = true, SyncNone
	s, err := Open(home, opts)
	if err != nil {
		t.Fatalf("open %s: %v", home, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func optionValue(opts []string, key string) (string, bool) {
	for _, o := range opts {
		if v, ok := strings.CutPrefix(o, key+"="); ok {
			return v, true
		}
	}
	return "", false
}

func TestMountSpec(t *testing.T) {
	ctx := context.Background()
	f := hostFeatures()
	f.IndexParam = true
	s := openWith(t, t.TempDir(), Options{Features: f, MountOptions: []string{"redirect_dir=on"}})
	must(t, s.Create(ctx, "base", ""))
	must(t, s.CreateReadWrite(ctx, "ctr", "base"))
	links := map[string]string{}
	for _, id := range []string{"base", "ctr"} {
		li, err := s.Layer(id)
		must(t, err)
		links[id] = filepath.Join(s.Home(), "l", li.Link)
	}

	spec, err := s.MountSpec(ctx, "ctr")
	must(t, err)
	if spec.Type != "overlay" || spec.ReadOnly {
		t.Errorf("container spec: %+v", spec)
	}
	want := []string{"lowerdir=" + links["base"], "upperdir=" + s.diffDir("ctr"), "workdir=" + s.workDir("ctr"),
		"index=off", "redirect_dir=on"}
	if !slices.Equal(spec.Options, want) {
		t.Errorf("container options\n got %q\nwant %q", spec.Options, want)
	}

	// base has a child, so it is committed: no upper, its own diff on
	// top of empty/, and the extra option on read-only mounts too.
	spec, err = s.MountSpec(ctx, "base")
	must(t, err)
	want = []string{"lowerdir=" + links["base"] + ":" + s.emptyDir(), "index=off", "redirect_dir=on", "ro", "nosuid", "nodev"}
	if !spec.ReadOnly || !slices.Equal(spec.Options, want) {
		t.Errorf("committed spec %v\n got %q\nwant %q", spec.ReadOnly, spec.Options, want)
	}
	if _, err := s.MountSpec(ctx, "nope"); !errors.Is(err, ErrNotExist) {
		t.Errorf("spec of a missing layer: %v", err)
	}
	// MountSpec records nothing.
	li, err := s.Layer("ctr")
	must(t, err)
	if len(li.Holds) != 0 || li.Mounts != 0 {
		t.Errorf("MountSpec left holds %v, mounts %d", li.Holds, li.Mounts)
	}
}

func TestMountOptionsRefused(t *testing.T) {
	for _, o := range []string{"upperdir=/x", "lowerdir=/a", "index=on", "volatile", "a,b", "", "fsync=strict", "userxattr", "strict_upper"} {
		_, err := Open(t.TempDir(), Options{Create: true, Features: hostFeatures(), MountOptions: []string{o}})
		if err == nil {
			t.Errorf("extra mount option %q accepted", o)
		}
	}
}

func TestStrictUpperSetting(t *testing.T) {
	f := hostFeatures()
	f.StrictUpper = true
	has := func(s *Store) bool {
		spec, err := s.MountSpec(context.Background(), "l")
		must(t, err)
		return slices.Contains(spec.Options, "strict_upper")
	}
	for _, c := range []struct {
		use  FeatureUse
		want bool
	}{{FeatureAuto, true}, {FeatureOn, true}, {FeatureOff, false}} {
		s := openWith(t, t.TempDir(), Options{Features: f, StrictUpper: c.use})
		must(t, s.CreateReadWrite(context.Background(), "l", ""))
		if got := has(s); got != c.want {
			t.Errorf("StrictUpper %q: strict_upper in spec = %v, want %v", c.use, got, c.want)
		}
	}
	s := openWith(t, t.TempDir(), Options{})
	must(t, s.CreateReadWrite(context.Background(), "l", ""))
	if has(s) {
		t.Error("auto without the kernel feature mounts with strict_upper")
	}
	_, err := Open(t.TempDir(), Options{Create: true, Features: hostFeatures(), StrictUpper: FeatureOn})
	if err == nil || !strings.Contains(err.Error(), "strict_upper") {
		t.Errorf("strict_upper required without the kernel feature: %v", err)
	}
	if _, err := Open(t.TempDir(), Options{Create: true, Features: hostFeatures(), StrictUpper: "maybe"}); err == nil {
		t.Error("unknown StrictUpper accepted")
	}
}

func TestCommitFreezes(t *testing.T) {
	ctx := context.Background()
	for _, layout := range []Layout{LayoutOverlay, LayoutHardlink} {
		t.Run(string(layout), func(t *testing.T) {
			s := openTest(t, t.TempDir(), layout)
			must(t, s.Create(ctx, "img", ""))
			must(t, s.CreateReadWrite(ctx, "ctr", "img"))
			spec, err := s.MountSpec(ctx, "ctr")
			must(t, err)
			if spec.ReadOnly {
				t.Fatal("a new container layer is read-only")
			}
			_, err = s.Acquire(ctx, "ctr", "writer")
			must(t, err)
			if err := s.Commit(ctx, "ctr"); !errors.Is(err, ErrMounted) {
				t.Fatalf("commit while held writable: %v, want ErrMounted", err)
			}
			must(t, s.Release(ctx, "ctr", "writer"))
			must(t, s.Commit(ctx, "ctr"))
			must(t, s.Commit(ctx, "ctr")) // again: nothing changes
			spec, err = s.MountSpec(ctx, "ctr")
			must(t, err)
			if !spec.ReadOnly || slices.ContainsFunc(spec.Options, func(o string) bool { return strings.HasPrefix(o, "upperdir=") }) {
				t.Errorf("committed container layer still writable: %+v", spec)
			}
			li, err := s.Layer("ctr")
			must(t, err)
			if !li.Committed {
				t.Error("Layer does not report the commit")
			}
			// Acquire of a committed layer is a read-only hold.
			spec, err = s.Acquire(ctx, "ctr", "reader")
			must(t, err)
			if !spec.ReadOnly {
				t.Error("Acquire of a committed layer is writable")
			}
			if p := checkClean(t, s); p != "" {
				t.Errorf("check after commit: %s", p)
			}
			if err := s.Commit(ctx, "missing"); !errors.Is(err, ErrNotExist) {
				t.Errorf("commit of a missing layer: %v", err)
			}
		})
	}
}

func checkClean(t *testing.T, s *Store) string {
	t.Helper()
	probs, err := s.Check()
	must(t, err)
	return Summary(probs)
}

func TestHoldsGuardTheLayer(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, t.TempDir(), LayoutOverlay)
	must(t, s.Create(ctx, "img", ""))
	must(t, s.CreateReadWrite(ctx, "ctr", "img"))
	_, err := s.ApplyDiff(ctx, "ctr", tarOf(t, reg("f", "applied")))
	must(t, err)
	rep, err := s.Verify(ctx, "ctr")
	must(t, err)
	if rep.State != StateOK {
		t.Fatalf("applied layer verifies %s", rep.State)
	}

	a, err := s.Acquire(ctx, "ctr", "a")
	must(t, err)
	if a.ReadOnly {
		t.Fatal("writable hold of a container layer is read-only")
	}
	again, err := s.Acquire(ctx, "ctr", "a")
	must(t, err)
	if !slices.Equal(a.Options, again.Options) {
		t.Errorf("second Acquire by the same holder: %q, then %q", a.Options, again.Options)
	}
	// A writable hold of an applied layer is a write, as Get's mount is.
	rep, err = s.Verify(ctx, "ctr")
	must(t, err)
	if rep.State != StateChanged {
		t.Errorf("after a writable hold the layer verifies %s, want %s", rep.State, StateChanged)
	}
	for what, err := range map[string]error{
		"second writer": second(s.Acquire(ctx, "ctr", "b")),
		"view":          second(s.View(ctx, "ctr", "v")),
		"remove":        s.Remove(ctx, "ctr"),
		"get":           second(s.Get(ctx, "ctr")),
		"child":         s.Create(ctx, "child", "ctr"),
		"commit":        s.Commit(ctx, "ctr"),
	} {
		if !errors.Is(err, ErrMounted) {
			t.Errorf("%s while held writable: %v, want ErrMounted", what, err)
		}
	}
	li, err := s.Layer("ctr")
	must(t, err)
	if len(li.Holds) != 1 || !li.Holds["a"].RW {
		t.Errorf("holds %v, want one writable hold of a", li.Holds)
	}
	// Holds are in the state: another store on the same home sees them.
	s2, err := Open(s.Home(), Options{Features: hostFeatures(), Sync: SyncNone})
	must(t, err)
	defer s2.Close()
	if err := s2.Remove(ctx, "ctr"); !errors.Is(err, ErrMounted) {
		t.Errorf("remove from a second store while held: %v", err)
	}

	// The image under it takes read-only holds; so does View.
	v, err := s.View(ctx, "img", "v1")
	must(t, err)
	if !v.ReadOnly || !slices.Contains(v.Options, "nosuid") {
		t.Errorf("view spec %+v", v)
	}
	if _, err := s.ApplyDiff(ctx, "img", tarOf(t, reg("g", "x"))); !errors.Is(err, ErrMounted) && !errors.Is(err, ErrHasChildren) {
		t.Errorf("apply to a held layer: %v", err)
	}

	must(t, s.Release(ctx, "ctr", "a"))
	if err := s.Release(ctx, "ctr", "a"); !errors.Is(err, ErrNotMounted) {
		t.Errorf("second release: %v, want ErrNotMounted", err)
	}
	if err := s.Remove(ctx, "img"); !errors.Is(err, ErrHasChildren) {
		t.Errorf("remove of a parent: %v", err)
	}
	must(t, s.Remove(ctx, "ctr"))
	if err := s.Remove(ctx, "img"); !errors.Is(err, ErrMounted) {
		t.Errorf("remove of a viewed layer: %v, want ErrMounted", err)
	}
	must(t, s.Release(ctx, "img", "v1"))
	must(t, s.Remove(ctx, "img"))
	if _, err := s.Acquire(ctx, "img", ""); err == nil {
		t.Error("hold without a holder name accepted")
	}
}

func second[T any](_ T, err error) error { return err }

// A view is no layer: it costs no depth, so the 500th layer of a chain
// has a view with 500 lowers, while a layer on top of it is refused.
func TestViewOfDeepestChain(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, filepath.Join(t.TempDir(), strings.Repeat("h", 200)), LayoutOverlay)
	parent := ""
	for i := 1; i <= ovl.MaxLowers; i++ {
		id := fmt.Sprintf("layer-%03d", i)
		must(t, s.Create(ctx, id, parent))
		parent = id
	}
	if err := s.Create(ctx, "too-deep", parent); !errors.Is(err, ErrTooDeep) {
		t.Fatalf("layer 501: %v", err)
	}
	spec, err := s.View(ctx, parent, "reader")
	must(t, err)
	low, _ := optionValue(spec.Options, "lowerdir")
	if n := len(strings.Split(low, ":")); n != ovl.MaxLowers {
		t.Errorf("view of a %d-layer chain has %d lowers", ovl.MaxLowers, n)
	}
	ls, err := s.Layers()
	must(t, err)
	if len(ls) != ovl.MaxLowers {
		t.Errorf("%d layers after the view, want %d", len(ls), ovl.MaxLowers)
	}
	// The caller's mount fits a page once the lowers are made relative to
	// their common directory, as containerd does.
	rel := strings.ReplaceAll(strings.Join(spec.Options, ","), filepath.Join(s.Home(), "l")+"/", "")
	if !ovl.FitsPage(len(rel), 4096) {
		t.Errorf("relative view data is %d bytes", len(rel))
	}
}

func TestDiskUsage(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, t.TempDir(), LayoutOverlay)
	must(t, s.Create(ctx, "l", ""))
	body := strings.Repeat("x", 10000)
	_, err := s.ApplyDiff(ctx, "l", tarOf(t, dir("d"), reg("d/f", body),
		tar.Header{Name: "d/hard", Typeflag: tar.TypeLink, Linkname: "d/f"}, reg("e", "")))
	must(t, err)
	u, err := s.DiskUsage(ctx, "l")
	must(t, err)
	// The diff root, d, d/f (and its second name), e.
	if u.Inodes != 4 {
		t.Errorf("inodes %d, want 4", u.Inodes)
	}
	var want int64
	for _, p := range []string{"", "d", "d/f", "e"} {
		var st unix.Stat_t
		must(t, unix.Lstat(filepath.Join(s.diffDir("l"), p), &st))
		want += st.Blocks * 512
	}
	if u.Bytes != want || u.Bytes < 10000 {
		t.Errorf("bytes %d, want %d (blocks of every inode once)", u.Bytes, want)
	}
	size, err := s.DiffSize("l")
	must(t, err)
	if size != 10000 {
		t.Errorf("DiffSize %d, want the apparent 10000", size)
	}
	if _, err := s.DiskUsage(ctx, "nope"); !errors.Is(err, ErrNotExist) {
		t.Errorf("usage of a missing layer: %v", err)
	}
}

func TestCreateOwner(t *testing.T) {
	ctx := context.Background()
	for _, layout := range []Layout{LayoutOverlay, LayoutHardlink} {
		t.Run(string(layout), func(t *testing.T) {
			s := openTest(t, t.TempDir(), layout)
			must(t, s.Create(ctx, "base", ""))
			must(t, s.CreateLayer(ctx, "img", "base", CreateOptions{Owner: &Owner{UID: 1000, GID: 1001}}))
			must(t, s.CreateLayer(ctx, "ctr", "img", CreateOptions{ReadWrite: true, Owner: &Owner{UID: 2000, GID: 2001}}))
			must(t, s.CreateReadWrite(ctx, "plain", "img"))
			check := func(p string, uid, gid uint32) {
				t.Helper()
				var st unix.Stat_t
				must(t, unix.Lstat(p, &st))
				if st.Uid != uid || st.Gid != gid {
					t.Errorf("%s owned by %d:%d, want %d:%d", p, st.Uid, st.Gid, uid, gid)
				}
			}
			check(s.diffDir("img"), 1000, 1001)
			if layout == LayoutHardlink {
				check(s.rootDir("img"), 1000, 1001)
			}
			check(s.diffDir("ctr"), 2000, 2001)
			// Without an owner a layer's root inherits its parent's.
			check(s.diffDir("plain"), 1000, 1001)
			li, err := s.Layer("ctr")
			must(t, err)
			if !li.RW {
				t.Error("CreateLayer ReadWrite made an image layer")
			}
			if err := s.CreateLayer(ctx, "bad", "", CreateOptions{Owner: &Owner{UID: -1}}); err == nil {
				t.Error("negative owner accepted")
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A writable hold under Options.Volatile is a volatile mount: the spec
// says so, and the boot is recorded on the layer before the spec is
// handed out, so that the layer is refused after a reboot as Get's are.
func TestAcquireVolatile(t *testing.T) {
	ctx := context.Background()
	s := openWith(t, t.TempDir(), Options{Volatile: true})
	must(t, s.Create(ctx, "img", ""))
	must(t, s.CreateReadWrite(ctx, "ctr", "img"))
	spec, err := s.Acquire(ctx, "ctr", "runtime")
	must(t, err)
	if !slices.Contains(spec.Options, "volatile") {
		t.Errorf("volatile store's writable spec %q", spec.Options)
	}
	var buf [128]byte
	n, err := unix.Lgetxattr(s.layerDir("ctr"), s.xattrName(volatileXattr), buf[:])
	must(t, err)
	if string(buf[:n]) != s.boot {
		t.Errorf("recorded boot %q, this boot %q", buf[:n], s.boot)
	}
	// A mark left by the kernel in another boot: the layer is refused.
	must(t, s.Release(ctx, "ctr", "runtime"))
	must(t, os.MkdirAll(filepath.Join(s.workDir("ctr"), "work", "incompat", "volatile"), 0o700))
	must(t, unix.Lsetxattr(s.layerDir("ctr"), s.xattrName(volatileXattr), []byte("another-boot"), 0))
	if _, err := s.Acquire(ctx, "ctr", "runtime"); !errors.Is(err, ErrVolatileLost) {
		t.Errorf("acquire after a volatile mount of another boot: %v, want ErrVolatileLost", err)
	}
	// Read-only specs never carry it.
	v, err := s.View(ctx, "img", "reader")
	must(t, err)
	if slices.Contains(v.Options, "volatile") {
		t.Errorf("view %q is volatile", v.Options)
	}
}
