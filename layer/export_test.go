package layer

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fsEnt describes one entry to create on disk for a test layer or tree.
type fsEnt struct {
	path   string
	kind   byte // 'f' file, 'd' dir, 'l' symlink, 'w' whiteout, 'c' char device
	body   string
	mode   uint32
	uid    int
	xattrs map[string]string
}

func f(p, body string) fsEnt            { return fsEnt{path: p, kind: 'f', body: body, mode: 0o644} }
func d(p string) fsEnt                  { return fsEnt{path: p, kind: 'd', mode: 0o755} }
func l(p, target string) fsEnt          { return fsEnt{path: p, kind: 'l', body: target} }
func wh(p string) fsEnt                 { return fsEnt{path: p, kind: 'w'} }
func (e fsEnt) withMode(m uint32) fsEnt { e.mode = m; return e }
func (e fsEnt) withOwner(uid int) fsEnt { e.uid = uid; return e }
func (e fsEnt) with(k, v string) fsEnt {
	x := map[string]string{}
	for a, b := range e.xattrs {
		x[a] = b
	}
	x[k] = v
	e.xattrs = x
	return e
}

// build creates ents beneath root in order, all with baseTime as mtime.
// A metacopy file is a sparse file of len(body) bytes with no data.
func build(t testing.TB, root string, ents ...fsEnt) {
	t.Helper()
	mkdirs(t, root)
	for _, e := range ents {
		p := filepath.Join(root, e.path)
		mkdirs(t, filepath.Dir(p))
		switch e.kind {
		case 'f':
			writeFile(t, p, e.body, 0o600)
			if _, meta := e.xattrs["trusted.overlay.metacopy"]; meta {
				if err := os.Truncate(p, 0); err != nil {
					t.Fatal(err)
				}
				if err := os.Truncate(p, int64(len(e.body))); err != nil {
					t.Fatal(err)
				}
			}
		case 'd':
			if err := os.Mkdir(p, 0o700); err != nil && !os.IsExist(err) {
				t.Fatal(err)
			}
		case 'l':
			if err := os.Symlink(e.body, p); err != nil {
				t.Fatal(err)
			}
		case 'w':
			mkWhiteout(t, p)
		}
		if err := os.Lchown(p, e.uid, e.uid); err != nil {
			t.Fatal(err)
		}
		if e.kind == 'f' || e.kind == 'd' {
			if err := unix.Chmod(p, e.mode); err != nil {
				t.Fatal(err)
			}
		}
		for k, v := range e.xattrs {
			setXattr(t, p, k, v)
		}
		ts := []unix.Timespec{timespec(baseTime), timespec(baseTime)}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
	}
}

func exportBytes(t testing.TB, diff string, opts ExportOptions) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Export(context.Background(), &buf, diff, opts); err != nil {
		t.Fatalf("Export: %v", err)
	}
	return buf.Bytes()
}

// TestExportOverlayTarUntar is go-archive's TestOverlayTarUntar: the exact
// entries, no device entries, no leaked overlay xattrs, and the same tree
// after applying the tar again.
func TestExportOverlayTarUntar(t *testing.T) {
	for _, format := range []WhiteoutFormat{OverlayWhiteouts, OverlayUserWhiteouts} {
		t.Run(format.String(), func(t *testing.T) {
			prefix, _ := format.xattrPrefix()
			src := filepath.Join(t.TempDir(), "src")
			build(t, src,
				d("d1").withMode(0o700).with(prefix+"opaque", "y"), f("d1/f1", "").withMode(0o600),
				d("d2").withMode(0o750).with(prefix+"opaque", "y"), f("d2/f1", "").withMode(0o660),
				d("d3").withMode(0o700), wh("d3/f1"),
			)
			b := exportBytes(t, src, ExportOptions{Whiteouts: format})
			equalLists(t, "tar entries", tarNames(t, b), []string{
				"d1/", "d1/.wh..wh..opq", "d1/f1", "d2/", "d2/.wh..wh..opq", "d2/f1", "d3/", "d3/.wh.f1",
			})
			modes := map[string]int64{"d1/.wh..wh..opq": 0o700, "d2/.wh..wh..opq": 0o750, "d3/.wh.f1": 0o600}
			for _, h := range tarHeaders(t, b) {
				if h.Typeflag == tar.TypeChar || h.Typeflag == tar.TypeBlock {
					t.Errorf("device entry %s in the tar", h.Name)
				}
				for k := range h.PAXRecords {
					if strings.HasPrefix(k, paxXattrPrefix) {
						t.Errorf("%s carries xattr record %s", h.Name, k)
					}
				}
				if m, ok := modes[h.Name]; ok && h.Mode != m {
					t.Errorf("%s mode %o, want %o", h.Name, h.Mode, m)
				}
			}
			dst := t.TempDir()
			mustApply(t, dst, b, ApplyOptions{Whiteouts: format})
			equalLists(t, "tree after round trip", tree(t, dst), tree(t, src))
		})
	}
}

func TestExportRedundantOpaque(t *testing.T) {
	base := t.TempDir()
	upper := filepath.Join(base, "upper")
	build(t, upper, d("d").with("trusted.overlay.opaque", "y"), f("d/f", "x"))
	whiteoutLower := filepath.Join(base, "wl")
	build(t, whiteoutLower, wh("d"))
	dirLower := filepath.Join(base, "dl")
	build(t, dirLower, d("d"), f("d/old", "o"))
	fileLower := filepath.Join(base, "fl")
	build(t, fileLower, f("d", "file"))
	for _, tc := range []struct {
		name   string
		lowers []string
		marker bool
	}{
		{"unknown lowers", nil, true},
		{"no lowers", []string{}, false},
		{"lower whiteout", []string{whiteoutLower, dirLower}, false},
		{"lower file", []string{fileLower}, false},
		{"lower dir", []string{dirLower}, true},
	} {
		got := tarNames(t, exportBytes(t, upper, ExportOptions{Lowers: tc.lowers}))
		want := []string{"d/", "d/f"}
		if tc.marker {
			want = []string{"d/", "d/.wh..wh..opq", "d/f"}
		}
		equalLists(t, tc.name, got, want)
	}
}

// redirectScenario is a layer made by renaming a lower directory with
// redirect_dir and by metacopy copy-ups (a chmod, and a rename of a
// file), with the flattened trees before and after.
func redirectScenario(t testing.TB, base string) (upper, lower, flatOld, flatNew string) {
	lower = filepath.Join(base, "lower")
	upper = filepath.Join(base, "upper")
	flatOld = filepath.Join(base, "old")
	flatNew = filepath.Join(base, "new")
	lowerEnts := []fsEnt{
		d("old"), f("old/a", "A"), f("old/b", "B"), d("old/sub"), f("old/sub/c", "C"),
		f("big", "hello world"), f("big2", "second file"), f("keep", "k"),
	}
	build(t, lower, lowerEnts...)
	build(t, flatOld, lowerEnts...)
	build(t, upper,
		wh("old"),
		d("new").with("trusted.overlay.redirect", "/old"), wh("new/b"), f("new/d", "D"),
		f("big", "hello world").withMode(0o600).with("trusted.overlay.metacopy", ""),
		wh("big2"),
		f("moved", "second file").withOwner(7).with("trusted.overlay.metacopy", "").with("trusted.overlay.redirect", "/big2"),
	)
	build(t, flatNew,
		f("big", "hello world").withMode(0o600), f("keep", "k"),
		f("moved", "second file").withOwner(7),
		d("new"), f("new/a", "A"), f("new/d", "D"), d("new/sub"), f("new/sub/c", "C"),
	)
	return upper, lower, flatOld, flatNew
}

func TestExportFollowsRedirectAndMetacopy(t *testing.T) {
	upper, lower, _, flatNew := redirectScenario(t, t.TempDir())
	b := exportBytes(t, upper, ExportOptions{Lowers: []string{lower}})
	equalLists(t, "tar entries", tarNames(t, b), []string{
		"big", ".wh.big2", "moved", "new/", "new/a", "new/d", "new/sub/", "new/sub/c", ".wh.old",
	})
	// Applied over the same lower, the tar gives the same merged tree.
	applied := t.TempDir()
	mustApply(t, applied, b, ApplyOptions{Lowers: []string{lower}})
	flat := t.TempDir()
	flatten(t, flat, lower, applied)
	equalLists(t, "merged tree of the applied export", tree(t, flat), tree(t, flatNew))

	for _, opts := range []ExportOptions{{}, {Lowers: []string{}}} {
		if err := Export(context.Background(), &bytes.Buffer{}, upper, opts); err == nil {
			t.Errorf("Export without the lowers (%v) succeeded on a redirected, metacopy'd diff", opts.Lowers)
		}
	}
}

func TestExportRoundTripRich(t *testing.T) {
	src := t.TempDir()
	mustApply(t, src, richLayer(t), ApplyOptions{})
	b := exportBytes(t, src, ExportOptions{})
	dst := t.TempDir()
	n := mustApply(t, dst, b, ApplyOptions{})
	equalLists(t, "tree after export and apply", tree(t, dst), tree(t, src))
	size, err := Size(src)
	if err != nil {
		t.Fatal(err)
	}
	if size != n {
		t.Errorf("Size(diff) = %d, Apply of its export returned %d", size, n)
	}
	var links int
	for _, h := range tarHeaders(t, b) {
		if h.Typeflag == tar.TypeLink {
			links++
			if h.Name != "bin/ls" || h.Linkname != "bin/busybox" {
				t.Errorf("hard link entry %s -> %s, want bin/ls -> bin/busybox", h.Name, h.Linkname)
			}
		}
	}
	if links != 1 {
		t.Errorf("%d hard link entries, want 1", links)
	}
}

func TestSizeCountsHardLinksOnce(t *testing.T) {
	root := t.TempDir()
	build(t, root, f("a", "12345"), d("d"), f("d/b", "123"), l("s", "a"), wh("gone"))
	if err := os.Link(filepath.Join(root, "a"), filepath.Join(root, "d/a2")); err != nil {
		t.Fatal(err)
	}
	got, err := Size(root)
	if err != nil {
		t.Fatal(err)
	}
	if got != 8 {
		t.Errorf("Size = %d, want 8", got)
	}
	if _, err := Size(filepath.Join(root, "missing")); err == nil {
		t.Error("Size of a missing directory succeeded")
	}
}

func TestExportChanges(t *testing.T) {
	root := t.TempDir()
	build(t, root, d("a"), f("a/new", "n"), f("a/mod", "m").withMode(0o600), l("link", "a/new"))
	var buf bytes.Buffer
	changes := []Change{
		{Path: "/link", Kind: ChangeAdd},
		{Path: "/a", Kind: ChangeModify},
		{Path: "/a/mod", Kind: ChangeModify},
		{Path: "/a/new", Kind: ChangeAdd},
		{Path: "/a/gone", Kind: ChangeDelete},
	}
	if err := ExportChanges(context.Background(), &buf, root, changes); err != nil {
		t.Fatal(err)
	}
	equalLists(t, "entries", tarNames(t, buf.Bytes()), []string{"a/", "a/.wh.gone", "a/mod", "a/new", "link"})
	dst := t.TempDir()
	mustApply(t, dst, buf.Bytes(), ApplyOptions{})
	equalLists(t, "applied", tree(t, dst), []string{
		"a: dir 0755 0:0",
		"a/gone: char 0000 0:0 0:0",
		"a/mod: file 0600 0:0 1 " + sha("m") + " mtime=1700000000.123456789",
		"a/new: file 0644 0:0 1 " + sha("n") + " mtime=1700000000.123456789",
		"link: symlink 0:0 -> a/new mtime=1700000000.123456789",
	})
	for _, bad := range []Change{{Path: "/../x", Kind: ChangeAdd}, {Path: "/", Kind: ChangeAdd}, {Path: "/a", Kind: 9}} {
		if err := ExportChanges(context.Background(), &bytes.Buffer{}, root, []Change{bad}); err == nil {
			t.Errorf("ExportChanges accepted %+v", bad)
		}
	}
}

// TestExportRefusesWhiteoutLikeNames: a diff entry whose name starts with
// ".wh." (a container can create one) would apply as a whiteout or an
// opaque marker; export refuses it, naming the path, rather than write a
// tar that applies as something else.
func TestExportRefusesWhiteoutLikeNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		ents []fsEnt
		path string
	}{
		{"directory", []fsEnt{d(".wh.x"), f(".wh.x/y", "y")}, ".wh.x"},
		{"file", []fsEnt{d("a"), f("a/.wh.b", "b")}, "a/.wh.b"},
		{"opaque marker name", []fsEnt{d("a"), d("a/.wh..wh..opq"), f("a/.wh..wh..opq/z", "z")}, "a/.wh..wh..opq"},
		{"whiteout of such a name", []fsEnt{wh(".wh.c")}, ".wh.c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := filepath.Join(t.TempDir(), "src")
			build(t, src, tc.ents...)
			err := Export(context.Background(), &bytes.Buffer{}, src, ExportOptions{})
			if err == nil || !strings.Contains(err.Error(), tc.path) {
				t.Errorf("Export: got %v, want an error naming %q", err, tc.path)
			}
		})
	}
	root := t.TempDir()
	build(t, root, d(".wh.x"), f(".wh.x/y", "y"))
	for _, c := range []Change{{Path: "/.wh.x", Kind: ChangeAdd}, {Path: "/.wh.x/y", Kind: ChangeAdd}, {Path: "/.wh.gone", Kind: ChangeDelete}} {
		err := ExportChanges(context.Background(), &bytes.Buffer{}, root, []Change{c})
		if err == nil || !strings.Contains(err.Error(), c.Path) {
			t.Errorf("ExportChanges(%v): got %v, want an error naming %s", c, err, c.Path)
		}
	}
}

// The copy buffer of an export grows with the files it copies, so that
// a small layer's diff does not pay for a full-size buffer.
func TestExportBufferGrowsWithFiles(t *testing.T) {
	tw := newTarWriter(context.Background(), io.Discard)
	for _, c := range []struct {
		size    int64
		wantLen int
	}{
		{64, minCopyBuf},
		{minCopyBuf, minCopyBuf},
		{minCopyBuf + 1, 2 * minCopyBuf},
		{100 << 10, 128 << 10},
		{10, 128 << 10}, // never shrinks
		{copyBufSize, copyBufSize},
		{64 << 20, copyBufSize}, // bounded
	} {
		if got := len(tw.buffer(c.size)); got != c.wantLen {
			t.Errorf("after a file of %d bytes: buffer of %d, want %d", c.size, got, c.wantLen)
		}
	}
}
