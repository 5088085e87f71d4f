//go:build ovlkit_guest

package graphsuite

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// Group 8: moby's TestApplyLayerWhiteouts idea as a 4-step table, applied
// as a chain of image layers; each mount must list exactly these paths.
func TestApplyWhiteoutsTable(t *testing.T) {
	steps := []struct {
		tar  []entry
		want []string
	}{
		{[]entry{dirE("a/"), file("a/b", "b"), file("a/c", "c"), file("d", "d"), file(".e", "e"), dirE("f/"), dirE("f/g/"), file("f/g/h", "h")},
			[]string{"/.e", "/a", "/a/b", "/a/c", "/d", "/f", "/f/g", "/f/g/h"}},
		{[]entry{file(".wh.d", ""), file("a/.wh.b", ""), file(".wh..e", ""), file("f/.wh..wh..opq", ""), file("f/i", "i")},
			[]string{"/a", "/a/c", "/f", "/f/i"}},
		{[]entry{file(".wh.a", ""), file("a2", "a2")},
			[]string{"/a2", "/f", "/f/i"}},
		{[]entry{file(".wh..wh..opq", ""), file("z", "z")},
			[]string{"/z"}},
	}
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout, noSync)
		parent := ""
		for i, st := range steps {
			id := string(rune('A' + i))
			must(t, s.Create(context.Background(), id, parent))
			apply(t, s, id, mkTar(t, st.tar...))
			equalList(t, "layer "+id, paths(t, get(t, s, id)), st.want)
			put(t, s, id)
			parent = id
		}
	})
}

// Group 8: moby's TestOverlayTarUntar through the store: opaque
// directories and a whiteout come back as exactly these members, with no
// device members and no overlay xattrs (checked by tarNames), and the
// modes survive.
func TestOverlayTarRoundTrip(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout, noSync)
		must(t, s.Create(context.Background(), "lower", ""))
		apply(t, s, "lower", mkTar(t, dirE("d1/"), file("d1/x", "x"), dirE("d2/"), file("d2/x", "x"), dirE("d3/"), file("d3/f1", "f1")))
		d1 := entry{name: "d1/", typ: tar.TypeDir, mode: 0o700}
		d2 := entry{name: "d2/", typ: tar.TypeDir, mode: 0o750}
		d3 := entry{name: "d3/", typ: tar.TypeDir, mode: 0o700}
		f1 := file("d1/f1", "f")
		f1.mode = 0o600
		f2 := file("d2/f1", "f")
		f2.mode = 0o660
		must(t, s.Create(context.Background(), "upper", "lower"))
		apply(t, s, "upper", mkTar(t, d1, file("d1/.wh..wh..opq", ""), f1, d2, file("d2/.wh..wh..opq", ""), f2, d3, file("d3/.wh.f1", "")))
		equalList(t, "upper tar", tarNames(t, s, "upper"),
			[]string{"d1/", "d1/.wh..wh..opq", "d1/f1", "d2/", "d2/.wh..wh..opq", "d2/f1", "d3/", "d3/.wh.f1"})
		p := get(t, s, "upper")
		equalList(t, "upper view", paths(t, p), []string{"/d1", "/d1/f1", "/d2", "/d2/f1", "/d3"})
		for path, mode := range map[string]uint32{"d1": 0o700, "d2": 0o750, "d3": 0o700, "d1/f1": 0o600, "d2/f1": 0o660} {
			if m := statMeta(t, filepath.Join(p, path)).mode & 0o7777; m != mode {
				t.Errorf("%s mode %o, want %o", path, m, mode)
			}
		}
		put(t, s, "upper")
	})
}

// Group 8: a directory re-created in a later layer over an earlier
// layer's whiteout hides the old content (buildkit #2614), and the
// re-creating layer's diff needs no opaque marker; a child tar that
// names only p/r makes p with the lower's mode and owner, not 0755 root.
func TestWhiteoutAcrossLayers(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout, noSync)
		p := entry{name: "p/", typ: tar.TypeDir, mode: 0o700, uid: 5, gid: 6}
		must(t, s.Create(context.Background(), "one", ""))
		apply(t, s, "one", mkTar(t, dirE("x/"), file("x/old", "old"), p, file("p/q", "q")))
		must(t, s.Create(context.Background(), "two", "one"))
		apply(t, s, "two", mkTar(t, file(".wh.x", "")))
		must(t, s.Create(context.Background(), "three", "two"))
		apply(t, s, "three", mkTar(t, dirE("x/"), file("x/new", "new"), file("p/r", "r")))
		root := get(t, s, "three")
		equalList(t, "three", paths(t, root), []string{"/p", "/p/q", "/p/r", "/x", "/x/new"})
		if m := statMeta(t, filepath.Join(root, "p")); m.mode&0o7777 != 0o700 || m.uid != 5 || m.gid != 6 {
			t.Errorf("implicit parent p: mode %o owner %d:%d, want 700 5:6", m.mode&0o7777, m.uid, m.gid)
		}
		put(t, s, "three")
		for _, n := range tarNames(t, s, "three") {
			if strings.Contains(n, ".wh..wh..opq") {
				t.Errorf("redundant opaque marker %s", n)
			}
		}
	})
}

// Group 8: whiteout names that name nothing are refused.
func TestInvalidWhiteoutNames(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout, noSync)
		for i, name := range []string{".wh.", ".wh..", ".wh..."} {
			id := string(rune('a' + i))
			must(t, s.Create(context.Background(), id, ""))
			_, err := s.ApplyDiff(context.Background(), id, bytes.NewReader(mkTar(t, file(name, ""))))
			if err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("whiteout %q: %v", name, err)
			}
		}
	})
}

// noTrace fails when a failed apply left anything: the layer must be
// empty and staging clean.
func noTrace(t *testing.T, s *graph.Store, id string) {
	t.Helper()
	p := get(t, s, id)
	if ents, _ := os.ReadDir(p); len(ents) != 0 {
		t.Errorf("layer %s shows %d entries after a failed apply", id, len(ents))
	}
	put(t, s, id)
	if ents, _ := os.ReadDir(filepath.Join(s.Home(), "staging")); len(ents) != 0 {
		t.Errorf("staging holds %d entries after a failed apply", len(ents))
	}
	if probs, err := s.Check(); err != nil || len(probs) != 0 {
		t.Errorf("check: %v %v", probs, err)
	}
}

// Group 9: breakout tars fail with an error naming the entry, nothing
// lands outside the layer, and the layer stays empty.
func TestBreakoutTars(t *testing.T) {
	cases := map[string]struct {
		entries []entry
		bad     string
	}{
		"dotdot":             {[]entry{file("../evil", "x")}, "../evil"},
		"slash-dotdot":       {[]entry{file("/../evil", "x")}, "/../evil"},
		"deep-dotdot":        {[]entry{dirE("a/"), file("a/../../evil", "x")}, "a/../../evil"},
		"hardlink-out":       {[]entry{hardlink("h", "../../../victim")}, "h"},
		"symlink-then-write": {[]entry{symlink("s", "/"), file("s/evil", "x")}, "s/evil"},
		"relative-symlink":   {[]entry{symlink("s", "../../.."), file("s/evil", "x")}, `"s`},
		"symlink-dir-chain":  {[]entry{symlink("s1", "s2"), symlink("s2", "/tmp"), file("s1/evil", "x")}, "s1/evil"},
		"overlay-redirect": {[]entry{{name: "d/", typ: tar.TypeDir, mode: 0o755,
			pax: map[string]string{"SCHILY.xattr.trusted.overlay.redirect": "/etc"}}}, "d"},
		"user-overlay-opaque": {[]entry{{name: "d/", typ: tar.TypeDir, mode: 0o755,
			pax: map[string]string{"SCHILY.xattr.user.overlay.opaque": "y"}}}, "d"},
	}
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout, noSync)
		victim := filepath.Join(filepath.Dir(s.Home()), "victim")
		guestfs.Write(t, victim, "safe", 0o644)
		i := 0
		for name, c := range cases {
			i++
			id := strings.ReplaceAll(name, "/", "-")
			must(t, s.Create(context.Background(), id, ""))
			_, err := s.ApplyDiff(context.Background(), id, bytes.NewReader(mkTar(t, c.entries...)))
			if err == nil {
				t.Errorf("%s: applied", name)
				continue
			}
			if !strings.Contains(err.Error(), c.bad) {
				t.Errorf("%s: error does not name %q: %v", name, c.bad, err)
			}
			noTrace(t, s, id)
		}
		if b, err := os.ReadFile(victim); err != nil || string(b) != "safe" {
			t.Errorf("victim changed: %q %v", b, err)
		}
		for _, p := range []string{"/evil", "/tmp/evil", filepath.Join(filepath.Dir(s.Home()), "evil")} {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("%s was created", p)
			}
		}
	})
}

// Group 9: junk in every compression, and a truncated layer, fail
// cleanly.
func TestJunkTars(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	junk := make([]byte, 64<<10)
	r.Read(junk)
	var gz, zs bytes.Buffer
	gw := gzip.NewWriter(&gz)
	gw.Write(junk)
	gw.Close()
	zw, err := zstd.NewWriter(&zs)
	must(t, err)
	zw.Write(junk)
	zw.Close()
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout, noSync)
		good := mkTar(t, file("a", strings.Repeat("a", 8192)), file("b", "b"))
		var gzGood bytes.Buffer
		w := gzip.NewWriter(&gzGood)
		w.Write(good)
		w.Close()
		inputs := map[string][]byte{
			"plain-junk":     junk,
			"gzip-junk":      gz.Bytes(),
			"zstd-junk":      zs.Bytes(),
			"truncated-tar":  good[:3000],
			"truncated-gzip": gzGood.Bytes()[:gzGood.Len()/2],
		}
		for name, in := range inputs {
			must(t, s.Create(context.Background(), name, ""))
			if _, err := s.ApplyDiff(context.Background(), name, bytes.NewReader(in)); err == nil {
				t.Errorf("%s: applied", name)
				continue
			}
			noTrace(t, s, name)
		}
	})
}

// Group 8: nested whiteouts (.wh.foo and foo/.wh.bar in one layer) are
// tolerated and foo is gone.
func TestNestedWhiteouts(t *testing.T) {
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		s := newStore(t, fs, layout, noSync)
		must(t, s.Create(context.Background(), "one", ""))
		apply(t, s, "one", mkTar(t, dirE("foo/"), file("foo/bar", "b"), file("keep", "k")))
		must(t, s.Create(context.Background(), "two", "one"))
		_, err := s.ApplyDiff(context.Background(), "two", bytes.NewReader(mkTar(t, file(".wh.foo", ""), file("foo/.wh.bar", ""))))
		if err != nil {
			t.Fatalf("nested whiteouts refused: %v", err)
		}
		equalList(t, "two", paths(t, get(t, s, "two")), []string{"/keep"})
		put(t, s, "two")
	})
}
