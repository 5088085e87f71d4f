package layer

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// richLayer holds every kind of entry a layer can carry.
func richLayer(t testing.TB) []byte {
	long := strings.Repeat("d", 120) + "/" + strings.Repeat("f", 200)
	caps := "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
	withX := reg("bin/ping", "ping", 0o755)
	withX.hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": caps, "SCHILY.xattr.user.note": "hello"}
	owned := reg("etc/shadow", "root:*:", 0o640)
	owned.hdr.Uid, owned.hdr.Gid = 0, 42
	suid := reg("bin/su", "su", 0o4755)
	suid.hdr.Uid, suid.hdr.Gid = 1, 2
	sticky := dir("tmp/", 0o1777)
	chr := ent{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3, ModTime: baseTime}}
	blk := ent{hdr: tar.Header{Typeflag: tar.TypeBlock, Name: "dev/sda", Mode: 0o660, Devmajor: 8, Devminor: 0, Gid: 6, ModTime: baseTime}}
	fifo := ent{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "run/fifo", Mode: 0o620, Uid: 7, ModTime: baseTime}}
	lnk := symlink("bin/sh", "/bin/busybox")
	lnk.hdr.Uid, lnk.hdr.Gid = 3, 4
	other := dir("home/user/", 0o700)
	other.hdr.Uid, other.hdr.Gid = 1000, 1000
	return mkTar(t,
		dir("bin/", 0o755), withX, suid, lnk,
		ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: 5, ModTime: baseTime}, body: "bbbbb"},
		hardlink("bin/ls", "bin/busybox"),
		dir("etc/", 0o755), owned,
		dir("dev/", 0o755), chr, blk,
		dir("run/", 0o755), fifo,
		sticky, other,
		dir(strings.Repeat("d", 120)+"/", 0o755),
		reg(long, "long", 0o644),
		reg("empty", "", 0o600),
	)
}

func TestApplyEntryKinds(t *testing.T) {
	root := t.TempDir()
	n := mustApply(t, root, richLayer(t), ApplyOptions{})
	if want := int64(len("ping") + len("su") + 5 + len("root:*:") + len("long")); n != want {
		t.Errorf("Apply returned %d content bytes, want %d", n, want)
	}
	mt := "mtime=1700000000.123456789"
	caps := "security.capability=\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
	sum := func(s string) string { return sha(s) }
	long := strings.Repeat("d", 120) + "/" + strings.Repeat("f", 200)
	want := []string{
		"bin: dir 0755 0:0",
		"bin/busybox: file 0755 0:0 5 " + sum("bbbbb") + " " + mt,
		"bin/ls: file 0755 0:0 5 " + sum("bbbbb") + " " + mt,
		"bin/ping: file 0755 0:0 4 " + sum("ping") + " " + mt + " " + caps + " user.note=hello",
		"bin/sh: symlink 3:4 -> /bin/busybox " + mt,
		"bin/su: file 4755 1:2 2 " + sum("su") + " " + mt,
		strings.Repeat("d", 120) + ": dir 0755 0:0",
		long + ": file 0644 0:0 4 " + sum("long") + " " + mt,
		"dev: dir 0755 0:0",
		"dev/null: char 0666 0:0 1:3",
		"dev/sda: block 0660 0:6 8:0",
		"empty: file 0600 0:0 0 " + sum("") + " " + mt,
		"etc: dir 0755 0:0",
		"etc/shadow: file 0640 0:42 7 " + sum("root:*:") + " " + mt,
		"home: dir 0755 0:0",
		"home/user: dir 0700 1000:1000",
		"run: dir 0755 0:0",
		"run/fifo: fifo 0620 7:0",
		"tmp: dir 1777 0:0",
	}
	equalLists(t, "applied tree", tree(t, root), want)

	var a, b unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, "bin/ls"), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lstat(filepath.Join(root, "bin/busybox"), &b); err != nil {
		t.Fatal(err)
	}
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("bin/ls is not a hard link of bin/busybox: inodes %d/%d nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	// Directory times are set after their content is written.
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, "bin"), &st); err != nil {
		t.Fatal(err)
	}
	if got := time.Unix(st.Mtim.Sec, st.Mtim.Nsec); !got.Equal(baseTime) {
		t.Errorf("bin mtime %v, want %v", got, baseTime)
	}
}

func TestApplyCompressions(t *testing.T) {
	plain := richLayer(t)
	ref := t.TempDir()
	mustApply(t, ref, plain, ApplyOptions{})
	want := tree(t, ref)
	for name, b := range map[string][]byte{"gzip": gzipped(t, plain), "zstd": zstded(t, plain)} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			mustApply(t, root, b, ApplyOptions{Sync: true})
			equalLists(t, name+" tree", tree(t, root), want)
		})
	}
}

func TestApplySparse(t *testing.T) {
	const size = 8 << 20
	body := make([]byte, size)
	copy(body[1<<20:], "data in the middle")
	copy(body[size-5:], "tail!")
	root := t.TempDir()
	mustApply(t, root, mkTar(t, reg("sparse", string(body), 0o644), reg("zeros", string(make([]byte, 1<<20)), 0o644)), ApplyOptions{})
	got, err := os.ReadFile(filepath.Join(root, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, body) {
		t.Fatal("sparse file content differs")
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(root, "sparse"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 >= size/2 {
		t.Errorf("sparse file uses %d bytes of disk for %d bytes of mostly zeros", st.Blocks*512, size)
	}
	if err := unix.Stat(filepath.Join(root, "zeros"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 1<<20 {
		t.Errorf("all-zero file has size %d, want %d", st.Size, 1<<20)
	}
}

// TestApplyOverlayWhiteouts is go-archive's TestOverlayTarUntar in the
// apply direction, for both on-disk formats.
func TestApplyOverlayWhiteouts(t *testing.T) {
	layer := mkTar(t,
		dir("d1/", 0o700), reg("d1/.wh..wh..opq", "", 0o700), reg("d1/f1", "", 0o600),
		dir("d2/", 0o750), reg("d2/.wh..wh..opq", "", 0o750), reg("d2/f1", "", 0o660),
		dir("d3/", 0o700), reg("d3/.wh.f1", "", 0o600),
	)
	for _, tc := range []struct {
		format WhiteoutFormat
		xattr  string
	}{{OverlayWhiteouts, "trusted.overlay.opaque=y"}, {OverlayUserWhiteouts, "user.overlay.opaque=y"}} {
		t.Run(tc.format.String(), func(t *testing.T) {
			root := t.TempDir()
			mustApply(t, root, layer, ApplyOptions{Whiteouts: tc.format})
			e := sha("")
			mt := " mtime=1700000000.123456789"
			equalLists(t, "tree", tree(t, root), []string{
				"d1: dir 0700 0:0 " + tc.xattr,
				"d1/f1: file 0600 0:0 0 " + e + mt,
				"d2: dir 0750 0:0 " + tc.xattr,
				"d2/f1: file 0660 0:0 0 " + e + mt,
				"d3: dir 0700 0:0",
				"d3/f1: char 0000 0:0 0:0",
			})
		})
	}
}

func TestApplyInvalidWhiteoutNames(t *testing.T) {
	for _, name := range []string{".wh.", ".wh..", ".wh...", "d/.wh..."} {
		root := t.TempDir()
		_, err := applyBytes(t, root, mkTar(t, reg(name, "", 0o600)), ApplyOptions{})
		var ee *EntryError
		if !errors.Is(err, ErrInvalidWhiteout) || !errors.As(err, &ee) || ee.Name != name {
			t.Errorf("entry %q: got %v, want invalid whiteout entry naming it", name, err)
		}
		if !strings.Contains(err.Error(), "invalid whiteout entry") {
			t.Errorf("entry %q: message %q lacks \"invalid whiteout entry\"", name, err)
		}
	}
}

func TestApplyWhiteoutOwnerAndNesting(t *testing.T) {
	wh := reg("a/.wh.gone", "", 0o600)
	wh.hdr.Uid, wh.hdr.Gid = 11, 12
	root := t.TempDir()
	// .wh.foo followed by foo/.wh.bar: the second is redundant, not an
	// error. The existing "x" is replaced by the whiteout.
	mustApply(t, root, mkTar(t, dir("a/", 0o755), wh, reg("x", "old", 0o644), reg(".wh.x", "", 0o600), reg(".wh.foo", "", 0o600), reg("foo/.wh.bar", "", 0o600)), ApplyOptions{})
	equalLists(t, "tree", tree(t, root), []string{
		"a: dir 0755 0:0",
		"a/gone: char 0000 11:12 0:0",
		"foo: char 0000 0:0 0:0",
		"x: char 0000 0:0 0:0",
	})
}

// applyLayers applies tars as a stack: each into its own diff with the
// previous diffs as lowers. It returns the diffs top first.
func applyLayers(t *testing.T, tars ...[]byte) []string {
	t.Helper()
	var diffs []string
	for _, b := range tars {
		d := t.TempDir()
		mustApply(t, d, b, ApplyOptions{Lowers: diffs})
		diffs = append([]string{d}, diffs...)
	}
	return diffs
}

// mergedNames lists the merged view of a stack like names does for a
// plain tree.
func mergedNames(t *testing.T, layers []string) []string {
	t.Helper()
	v := &fsView{layers: layers, prefix: "trusted.overlay."}
	root, err := v.root()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	var walk func(prefix string, n node)
	walk = func(prefix string, n node) {
		ns, err := v.names(n)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range ns {
			c, err := v.lookup(n, name)
			if err != nil {
				t.Fatal(err)
			}
			if !c.exists {
				continue
			}
			if c.isDir() {
				out = append(out, prefix+name+"/")
				walk(prefix+name+"/", c)
			} else {
				out = append(out, prefix+name)
			}
		}
	}
	walk("", root)
	return out
}

// TestApplyLayerWhiteouts replays go-archive's four-layer whiteout table on
// overlay diffs: the merged view after each layer must match.
func TestApplyLayerWhiteouts(t *testing.T) {
	base := []string{".baz", "bar/", "bar/bax", "bar/bay/", "baz", "foo/", "foo/.abc", "foo/.bcd/", "foo/.bcd/a", "foo/cde/", "foo/cde/def", "foo/cde/efg", "foo/fgh", "foobar"}
	steps := []struct{ change, expected []string }{
		{base, base},
		{
			[]string{".bay", ".wh.baz", "foo/", "foo/.bce", "foo/.wh..wh..opq", "foo/cde/", "foo/cde/efg"},
			[]string{".bay", ".baz", "bar/", "bar/bax", "bar/bay/", "foo/", "foo/.bce", "foo/cde/", "foo/cde/efg", "foobar"},
		},
		{
			[]string{".bay", ".wh..baz", ".wh.foobar", "foo/", "foo/.wh.cde", "bar/"},
			[]string{".bay", "bar/", "bar/bax", "bar/bay/", "foo/", "foo/.bce"},
		},
		{
			[]string{".abc", ".wh..wh..opq", "foobar"},
			[]string{".abc", "foobar"},
		},
	}
	var tars [][]byte
	for i, s := range steps {
		var es []ent
		for _, n := range s.change {
			if strings.HasSuffix(n, "/") {
				es = append(es, dir(n, 0o755))
			} else {
				es = append(es, reg(n, n, 0o644))
			}
		}
		tars = append(tars, mkTar(t, es...))
		diffs := applyLayers(t, tars...)
		equalLists(t, "merged view after layer "+string(rune('0'+i)), mergedNames(t, diffs), s.expected)
	}
}

func TestApplyImplicitParentsFromLowers(t *testing.T) {
	lower := t.TempDir()
	if err := os.Mkdir(filepath.Join(lower, "a"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(filepath.Join(lower, "a"), 0o2711); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(filepath.Join(lower, "a"), 5, 6); err != nil {
		t.Fatal(err)
	}
	setXattr(t, filepath.Join(lower, "a"), "trusted.note", "lower")
	if err := os.Chtimes(filepath.Join(lower, "a"), baseTime, baseTime); err != nil {
		t.Fatal(err)
	}
	upper := t.TempDir()
	mustApply(t, upper, mkTar(t, reg("a/b/file", "x", 0o644)), ApplyOptions{Lowers: []string{lower}})
	equalLists(t, "tree", tree(t, upper), []string{
		"a: dir 2711 5:6 trusted.note=lower",
		"a/b: dir 0755 0:0",
		"a/b/file: file 0644 0:0 1 " + sha("x") + " mtime=1700000000.123456789",
	})
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(upper, "a"), &st); err != nil {
		t.Fatal(err)
	}
	if got := time.Unix(st.Mtim.Sec, st.Mtim.Nsec); !got.Equal(baseTime) {
		t.Errorf("implicit parent mtime %v, want the lower's %v", got, baseTime)
	}
}

func TestApplyReplacesExisting(t *testing.T) {
	root := t.TempDir()
	mustApply(t, root, mkTar(t,
		dir("d/", 0o755), reg("d/f", "1", 0o644),
		reg("d", "now a file", 0o600),                                     // a file replaces a directory
		reg("x", "file", 0o644), dir("x/", 0o700), reg("x/y", "2", 0o644), // and the other way round
		symlink("s", "x"), reg("s", "replaced link", 0o644),
		reg("dup", "first", 0o644), reg("dup", "second", 0o644),
	), ApplyOptions{})
	mt := " mtime=1700000000.123456789"
	equalLists(t, "tree", tree(t, root), []string{
		"d: file 0600 0:0 10 " + sha("now a file") + mt,
		"dup: file 0644 0:0 6 " + sha("second") + mt,
		"s: file 0644 0:0 13 " + sha("replaced link") + mt,
		"x: dir 0700 0:0",
		"x/y: file 0644 0:0 1 " + sha("2") + mt,
	})
}

func TestApplyRefusesOverlayXattrs(t *testing.T) {
	for _, x := range []string{"trusted.overlay.redirect", "trusted.overlay.opaque", "user.overlay.metacopy", "user.overlay.whiteout"} {
		e := dir("d/", 0o755)
		e.hdr.PAXRecords = map[string]string{"SCHILY.xattr." + x: "/etc"}
		root := t.TempDir()
		_, err := applyBytes(t, root, mkTar(t, reg("ok", "", 0o644), e), ApplyOptions{})
		var ee *EntryError
		if !errors.Is(err, ErrOverlayXattr) || !errors.As(err, &ee) || ee.Name != "d/" {
			t.Errorf("xattr %s: got %v, want ErrOverlayXattr naming d/", x, err)
		}
		if _, err := os.Lstat(filepath.Join(root, "d")); err == nil {
			t.Errorf("xattr %s: the refused entry was created", x)
		}
	}
}

func TestApplyMalformed(t *testing.T) {
	good := mkTar(t, dir("a/", 0o755), reg("a/f", strings.Repeat("x", 3000), 0o644), reg("b", "bb", 0o644))
	cases := map[string][]byte{
		"empty":       {},
		"junk":        []byte(strings.Repeat("not a tar ", 200)),
		"gzip junk":   append([]byte{0x1f, 0x8b}, make([]byte, 100)...),
		"zstd junk":   append([]byte{0x28, 0xb5, 0x2f, 0xfd}, []byte("garbage garbage garbage")...),
		"xz":          {0xfd, '7', 'z', 'X', 'Z', 0, 1, 2},
		"bad chksum":  func() []byte { b := bytes.Clone(good); b[148] ^= 0x11; return b }(),
		"gzip cut":    func() []byte { g := gzipped(t, good); return g[:len(g)-10] }(),
		"zstd cut":    func() []byte { z := zstded(t, good); return z[:len(z)-6] }(),
		"gzip badcrc": func() []byte { g := gzipped(t, good); g[len(g)-6] ^= 0xff; return g }(),
	}
	// Every cut of the plain stream before its end marker, at block
	// boundaries (where archive/tar alone reports a clean end) and inside
	// blocks.
	end := len(good) - 1024
	for cut := 0; cut < end; cut += 256 {
		cases["cut at "+itoa(cut)] = good[:cut]
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := applyBytes(t, t.TempDir(), b, ApplyOptions{})
			if err == nil {
				t.Fatal("Apply succeeded on a malformed layer")
			}
		})
	}
	// The intact stream, and one missing only its second zero block,
	// apply.
	if _, err := applyBytes(t, t.TempDir(), good[:len(good)-512], ApplyOptions{}); err != nil {
		t.Errorf("tar with one end block: %v", err)
	}
}

func TestApplyCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Apply(ctx, t.TempDir(), bytes.NewReader(richLayer(t)), ApplyOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

func TestApplyRootEntry(t *testing.T) {
	root := t.TempDir()
	r := dir("./", 0o750)
	r.hdr.Uid, r.hdr.Gid = 8, 9
	mustApply(t, root, mkTar(t, r, reg("./f", "x", 0o644)), ApplyOptions{})
	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o750 || st.Uid != 8 || st.Gid != 9 {
		t.Errorf("root is %o %d:%d, want 0750 8:9", st.Mode&0o7777, st.Uid, st.Gid)
	}
	if _, err := applyBytes(t, t.TempDir(), mkTar(t, reg(".", "", 0o644)), ApplyOptions{}); err == nil {
		t.Error("a regular file as the layer root was accepted")
	}
}

func TestApplyMaxSize(t *testing.T) {
	layer := mkTar(t, reg("a", "12345", 0o644), reg("b", "678", 0o644))
	if _, err := applyBytes(t, t.TempDir(), layer, ApplyOptions{MaxSize: 8}); err != nil {
		t.Errorf("layer of exactly MaxSize: %v", err)
	}
	_, err := applyBytes(t, t.TempDir(), layer, ApplyOptions{MaxSize: 7})
	var ee *EntryError
	if !errors.Is(err, ErrTooLarge) || !errors.As(err, &ee) || ee.Name != "b" {
		t.Errorf("got %v, want ErrTooLarge naming b", err)
	}
}

// TestApplyDirectoryOverWhiteout: a layer that deletes a directory and
// creates it again must not let the lower's content show through.
func TestApplyDirectoryOverWhiteout(t *testing.T) {
	root := t.TempDir()
	mustApply(t, root, mkTar(t,
		reg(".wh.a", "", 0o600), dir("a/", 0o755), reg("a/new", "n", 0o644),
		reg(".wh.b", "", 0o600), reg("b/implicit", "i", 0o644),
	), ApplyOptions{})
	mt := " mtime=1700000000.123456789"
	equalLists(t, "tree", tree(t, root), []string{
		"a: dir 0755 0:0 trusted.overlay.opaque=y",
		"a/new: file 0644 0:0 1 " + sha("n") + mt,
		"b: dir 0755 0:0 trusted.overlay.opaque=y",
		"b/implicit: file 0644 0:0 1 " + sha("i") + mt,
	})
}

// TestApplyOwnerInSetgidDirectory: a file created in a setgid directory
// takes the directory's group, so an entry owned 0:0 must still be
// chowned there.
func TestApplyOwnerInSetgidDirectory(t *testing.T) {
	g := dir("g/", 0o2775)
	g.hdr.Gid = 50
	inherit := reg("g/h", "h", 0o644)
	inherit.hdr.Gid = 50
	root := t.TempDir()
	// "late/" is listed after a file in it: its setgid bit must count
	// for the files that follow.
	late := dir("late/", 0o2755)
	late.hdr.Gid = 60
	mustApply(t, root, mkTar(t, g, reg("g/f", "f", 0o644), inherit, reg("top", "t", 0o644),
		reg("late/a", "a", 0o644), late, reg("late/b", "b", 0o644)), ApplyOptions{})
	mt := " mtime=1700000000.123456789"
	equalLists(t, "tree", tree(t, root), []string{
		"g: dir 2775 0:50",
		"g/f: file 0644 0:0 1 " + sha("f") + mt,
		"g/h: file 0644 0:50 1 " + sha("h") + mt,
		"late: dir 2755 0:60",
		"late/a: file 0644 0:0 1 " + sha("a") + mt,
		"late/b: file 0644 0:0 1 " + sha("b") + mt,
		"top: file 0644 0:0 1 " + sha("t") + mt,
	})
}

// A file is created with its final mode when nothing can change it; a
// mode the umask would cut, or a directory whose default ACL replaces the
// umask, must still end with exactly the entry's mode.
func TestApplyModesDespiteUmaskAndDefaultACL(t *testing.T) {
	root := t.TempDir()
	// A default ACL of u::rwx,g::r-x,o::--- would make a file created
	// with 0644 come out 0640.
	acl := []byte{
		2, 0, 0, 0, // version
		0x01, 0, 7, 0, 0xff, 0xff, 0xff, 0xff, // ACL_USER_OBJ rwx
		0x04, 0, 5, 0, 0xff, 0xff, 0xff, 0xff, // ACL_GROUP_OBJ r-x
		0x20, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, // ACL_OTHER ---
	}
	aclDir := filepath.Join(root, "acl")
	if err := os.Mkdir(aclDir, 0o755); err != nil {
		t.Fatal(err)
	}
	haveACL := unix.Setxattr(aclDir, "system.posix_acl_default", acl, 0) == nil
	owned := reg("owned", "x", 0o750)
	owned.hdr.Uid, owned.hdr.Gid = 5, 6
	tarb := mkTar(t,
		owned,
		reg("plain", "p", 0o644),
		reg("groupw", "g", 0o664),
		reg("open", "o", 0o666),
		reg("setuid", "s", 0o4755),
		reg("acl/file", "a", 0o644),
	)
	mustApply(t, root, tarb, ApplyOptions{})
	want := map[string]os.FileMode{
		"owned":    0o750,
		"plain":    0o644,
		"groupw":   0o664,
		"open":     0o666,
		"setuid":   0o755 | os.ModeSetuid,
		"acl/file": 0o644,
	}
	for name, mode := range want {
		fi, err := os.Lstat(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != mode {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode(), mode)
		}
	}
	if !haveACL {
		t.Log("the test filesystem takes no default ACL; the ACL case ran without one")
	}
}

// roundTrip exports the tree root (lowers unknown) and applies the result
// to a fresh directory, which it returns.
func roundTrip(t *testing.T, root string) string {
	t.Helper()
	again := t.TempDir()
	mustApply(t, again, exportBytes(t, root, ExportOptions{}), ApplyOptions{})
	return again
}

// TestApplyWhiteoutLikeNames: a name that starts with ".wh." anywhere but
// in the final component of a whiteout or opaque marker would apply as
// something its export cannot say: a directory ".wh.x" exports as-is and
// applies again as a whiteout of "x". Such entries are refused, naming
// the entry; if one is ever accepted, export and apply must reproduce it.
func TestApplyWhiteoutLikeNames(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []ent
		failOn  string
	}{
		{"implicit parent", []ent{reg(".wh.x/y", "y", 0o644)}, ".wh.x/y"},
		{"implicit parent deep", []ent{dir("a/", 0o755), reg("a/.wh.b/c", "c", 0o644)}, "a/.wh.b/c"},
		{"under the opaque marker", []ent{reg(".wh..wh..opq/z", "z", 0o644)}, ".wh..wh..opq/z"},
		{"directory entry", []ent{dir(".wh.x/", 0o755)}, ".wh.x/"},
		{"opaque marker as a directory", []ent{dir("d/", 0o755), dir("d/.wh..wh..opq/", 0o755)}, "d/.wh..wh..opq/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			_, err := applyBytes(t, root, mkTar(t, tc.entries...), ApplyOptions{})
			if err == nil {
				equalLists(t, "tree after export and apply", fullTree(t, roundTrip(t, root)), fullTree(t, root))
				t.Fatalf("Apply accepted the layer, want an error naming %q", tc.failOn)
			}
			var ee *EntryError
			if !errors.Is(err, ErrInvalidWhiteout) || !errors.As(err, &ee) || ee.Name != tc.failOn {
				t.Fatalf("got %v, want an invalid whiteout entry error naming %q", err, tc.failOn)
			}
		})
	}
}

// TestApplyAUFSMetadataSkipped: AUFS kept its own bookkeeping under
// ".wh..wh." names; such entries, and what is below them, describe
// nothing in the layer.
func TestApplyAUFSMetadataSkipped(t *testing.T) {
	root := t.TempDir()
	mustApply(t, root, mkTar(t,
		dir(".wh..wh.plnk/", 0o700), reg(".wh..wh.plnk/123.456", "x", 0o644),
		reg(".wh..wh.aufs", "", 0o600), dir("d/", 0o755), reg("d/.wh..wh.aufs", "", 0o600),
	), ApplyOptions{})
	equalLists(t, "tree", tree(t, root), []string{"d: dir 0755 0:0"})
}

// TestApplyWhiteoutOfListedDirectory: a whiteout that follows a
// directory and its subdirectories in the same tar deletes them; setting
// directory times or syncing at the end must not bring them back.
func TestApplyWhiteoutOfListedDirectory(t *testing.T) {
	for _, sync := range []bool{false, true} {
		root := t.TempDir()
		mustApply(t, root, mkTar(t, dir("x/", 0o755), dir("x/y/", 0o755), reg("x/y/f", "f", 0o644), reg(".wh.x", "", 0o600)), ApplyOptions{Sync: sync})
		equalLists(t, fmt.Sprintf("tree (sync %v)", sync), tree(t, root), []string{"x: char 0000 0:0 0:0"})
	}
}

// TestApplySizeAfterReplacements: the size Apply returns is what Size
// reads back from the layer (and what the store's check compares), also
// when later entries replace or white out earlier ones.
func TestApplySizeAfterReplacements(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []ent
	}{
		{"duplicate file", []ent{reg("dup", "first", 0o644), reg("dup", "second!", 0o644)}},
		{"whited-out file", []ent{reg("f", "12345", 0o644), reg(".wh.f", "", 0o600)}},
		{"whited-out directory", []ent{dir("d/", 0o755), reg("d/f", "12345", 0o644), reg(".wh.d", "", 0o600)}},
		{"directory over a file", []ent{reg("x", "12345", 0o644), dir("x/", 0o755), reg("x/y", "1", 0o644)}},
		{"hard link outlives its first name", []ent{reg("a", "12345", 0o644), hardlink("b", "a"), reg(".wh.a", "", 0o600)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			n := mustApply(t, root, mkTar(t, tc.entries...), ApplyOptions{})
			size, err := Size(root)
			if err != nil {
				t.Fatal(err)
			}
			if n != size {
				t.Errorf("Apply returned %d content bytes, Size reads %d", n, size)
			}
		})
	}
}

// TestApplyFileOverListedDirectories: a file that replaces a directory
// listed earlier with its subdirectories is a valid layer.
func TestApplyFileOverListedDirectories(t *testing.T) {
	root := t.TempDir()
	mustApply(t, root, mkTar(t, dir("x/", 0o755), dir("x/y/", 0o755), reg("x", "file", 0o644)), ApplyOptions{})
	equalLists(t, "tree", tree(t, root), []string{"x: file 0644 0:0 4 " + sha("file") + " mtime=1700000000.123456789"})
}

// TestApplyOwnerThroughAlias: what Apply remembers about a directory
// (the group a new file gets there) belongs to the directory, not to the
// tar path it was reached by. Here g turns setgid after a file went in
// through the alias l; the next file through l must still end up 0:0.
func TestApplyOwnerThroughAlias(t *testing.T) {
	g := dir("g/", 0o2755)
	g.hdr.Gid = 50
	root := t.TempDir()
	mustApply(t, root, mkTar(t, dir("g/", 0o755), symlink("l", "g"), reg("l/a", "a", 0o644), g, reg("l/b", "b", 0o644)), ApplyOptions{})
	mt := " mtime=1700000000.123456789"
	equalLists(t, "tree", tree(t, root), []string{
		"g: dir 2755 0:50",
		"g/a: file 0644 0:0 1 " + sha("a") + mt,
		"g/b: file 0644 0:0 1 " + sha("b") + mt,
		"l: symlink 0:0 -> g" + mt,
	})
}

// TestApplyRootOpaqueThroughAlias: an opaque marker that reaches the
// root through a symlink marks the root opaque like one at the top of
// the tar, so the lowers' root entries are whited out.
func TestApplyRootOpaqueThroughAlias(t *testing.T) {
	lower := t.TempDir()
	writeFile(t, filepath.Join(lower, "old"), "o", 0o644)
	upper := t.TempDir()
	mustApply(t, upper, mkTar(t, symlink("l", "."), reg("l/.wh..wh..opq", "", 0o755)), ApplyOptions{Lowers: []string{lower}})
	equalLists(t, "merged view", mergedNames(t, []string{upper, lower}), []string{"l"})
}

// TestApplySymlinkResolvedNotLexical: a relative symlink target is
// judged by where it resolves in the layer, following the layer's own
// symlinks, not by counting its components.
func TestApplySymlinkResolvedNotLexical(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []ent
		failOn  string
	}{
		{"through a link to the root", []ent{symlink("d", "."), symlink("up", "d/..")}, "up"},
		{"link to the root comes later", []ent{symlink("up", "d/.."), symlink("d", ".")}, "up"},
		{"through a chain", []ent{dir("a/", 0o755), symlink("a/r", ".."), symlink("a/up", "r/../x")}, "a/up"},
		// Lexically s/../.. climbs above the root; s leads two levels
		// down, so it stays inside.
		{"inside through a deeper link", []ent{dir("a/b/c/", 0o755), symlink("s", "a/b/c"), symlink("up", "s/../..")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := applyBytes(t, t.TempDir(), mkTar(t, tc.entries...), ApplyOptions{})
			if tc.failOn == "" {
				if err != nil {
					t.Fatalf("Apply: %v", err)
				}
				return
			}
			var ee *EntryError
			if !errors.Is(err, ErrUnsafePath) || !errors.As(err, &ee) || ee.Name != tc.failOn {
				t.Fatalf("got %v, want ErrUnsafePath naming %q", err, tc.failOn)
			}
		})
	}
}
