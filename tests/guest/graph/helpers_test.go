//go:build ovlkit_guest

// Package graphsuite is the layer store's suite in the guest: every test
// runs on tmpfs, ext4, xfs and btrfs uppers and, where the layout matters,
// with both the overlay and the hardlink layout. It must pass on the stock
// kernel; the tests that need the ovlkit series say so with Proves.
package graphsuite

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/layer"
	"github.com/ovlkit/ovlkit/ovl"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

var layouts = []graph.Layout{graph.LayoutOverlay, graph.LayoutHardlink}

// probed caches one probe per filesystem for the whole test binary: the
// probe mounts a dozen overlays and its result cannot change within a
// boot. TestStatusProbes runs the store's own probe path.
var probed sync.Map // fs name -> ovl.Features

func features(t *testing.T, fs guesttest.FS) *ovl.Features {
	t.Helper()
	if f, ok := probed.Load(fs.Name); ok {
		ff := f.(ovl.Features)
		return &ff
	}
	f, err := ovl.Probe(fs.Scratch(t, ""))
	if err != nil {
		t.Fatalf("probe %s: %v", fs.Name, err)
	}
	probed.Store(fs.Name, f)
	return &f
}

// newStore opens a fresh store on fs.
func newStore(t *testing.T, fs guesttest.FS, layout graph.Layout, opts ...func(*graph.Options)) *graph.Store {
	t.Helper()
	o := graph.Options{Create: true, Layout: layout, Features: features(t, fs)}
	for _, f := range opts {
		f(&o)
	}
	home := filepath.Join(fs.Scratch(t, ""), "store")
	s, err := graph.Open(home, o)
	if err != nil {
		t.Fatalf("open store on %s: %v", fs.Name, err)
	}
	t.Cleanup(func() {
		if err := s.Cleanup(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		s.Close()
	})
	return s
}

func noSync(o *graph.Options) { o.Sync = graph.SyncNone }

// forEach runs fn on every filesystem with every layout.
func forEach(t *testing.T, fn func(t *testing.T, fs guesttest.FS, layout graph.Layout)) {
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		for _, l := range layouts {
			l := l
			t.Run(string(l), func(t *testing.T) { fn(t, fs, l) })
		}
	})
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, s *graph.Store, id string) string {
	t.Helper()
	p, err := s.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return p
}

func put(t *testing.T, s *graph.Store, id string) {
	t.Helper()
	if err := s.Put(context.Background(), id); err != nil {
		t.Fatalf("put %s: %v", id, err)
	}
}

// entry is one tar member as built by the tests.
type entry struct {
	name  string
	typ   byte
	body  string
	link  string
	mode  int64
	uid   int
	gid   int
	pax   map[string]string
	major int64
}

func file(name, body string) entry {
	return entry{name: name, typ: tar.TypeReg, body: body, mode: 0o644}
}
func dirE(name string) entry { return entry{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, target string) entry {
	return entry{name: name, typ: tar.TypeSymlink, link: target, mode: 0o777}
}
func hardlink(name, target string) entry {
	return entry{name: name, typ: tar.TypeLink, link: target, mode: 0o644}
}

func mkTar(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			Size: int64(len(e.body)), PAXRecords: e.pax, Devmajor: e.major, Format: tar.FormatPAX}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		must(t, tw.WriteHeader(h))
		if e.typ == tar.TypeReg {
			_, err := io.WriteString(tw, e.body)
			must(t, err)
		}
	}
	must(t, tw.Close())
	return buf.Bytes()
}

func apply(t *testing.T, s *graph.Store, id string, tarball []byte) int64 {
	t.Helper()
	n, err := s.ApplyDiff(context.Background(), id, bytes.NewReader(tarball))
	if err != nil {
		t.Fatalf("apply %s: %v", id, err)
	}
	return n
}

// tarNames lists the member names of the store's Diff of id, in order,
// with a trailing / on directories, and fails on device members and
// overlay xattrs, which a layer must never carry.
func tarNames(t *testing.T, s *graph.Store, id string) []string {
	t.Helper()
	var buf bytes.Buffer
	must(t, s.Diff(context.Background(), id, &buf))
	tr := tar.NewReader(&buf)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(t, err)
		if h.Typeflag == tar.TypeChar || h.Typeflag == tar.TypeBlock {
			t.Errorf("diff of %s has device member %s", id, h.Name)
		}
		for k := range h.PAXRecords {
			if strings.Contains(k, ".overlay.") {
				t.Errorf("diff of %s leaks %s on %s", id, k, h.Name)
			}
		}
		n := strings.TrimPrefix(h.Name, "./")
		if h.Typeflag == tar.TypeDir && !strings.HasSuffix(n, "/") {
			n += "/"
		}
		names = append(names, n)
	}
	return names
}

func diffBytes(t *testing.T, s *graph.Store, id string) []byte {
	t.Helper()
	var buf bytes.Buffer
	must(t, s.Diff(context.Background(), id, &buf))
	return buf.Bytes()
}

func changes(t *testing.T, s *graph.Store, id string) []string {
	t.Helper()
	ch, err := s.Changes(context.Background(), id)
	if err != nil {
		t.Fatalf("changes %s: %v", id, err)
	}
	out := make([]string, len(ch))
	for i, c := range ch {
		out[i] = c.String()
	}
	return out
}

func sorted(s []string) []string {
	c := append([]string(nil), s...)
	sort.Strings(c)
	return c
}

func equalList(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s:\ngot:\n  %s\nwant:\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// node is what a tree comparison looks at for one path.
type node struct {
	Mode   uint32
	UID    uint32
	GID    uint32
	Size   int64
	Sum    string
	Link   string
	Rdev   uint64
	Xattrs string
	// LinkedTo names the first path (in walk order) sharing this inode,
	// for hard links.
	LinkedTo string
}

// snapshot walks root and records every path but root itself. Overlay
// xattrs are left out: they are how a layer stores its changes, not
// content.
func snapshot(t *testing.T, root string) map[string]node {
	t.Helper()
	out := map[string]node{}
	inodes := map[uint64]string{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." || rel == "lost+found" {
			if rel == "lost+found" && fi.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		n := node{Mode: st.Mode, UID: st.Uid, GID: st.Gid}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h := sha256.Sum256(b)
			n.Size, n.Sum = st.Size, hex.EncodeToString(h[:8])
			if st.Nlink > 1 {
				if first, ok := inodes[st.Ino]; ok {
					n.LinkedTo = first
				} else {
					inodes[st.Ino] = rel
				}
			}
		case unix.S_IFLNK:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			n.Link = l
		case unix.S_IFCHR, unix.S_IFBLK:
			n.Rdev = st.Rdev
		}
		n.Xattrs = xattrs(p)
		out["/"+rel] = n
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return out
}

func xattrs(p string) string {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		return ""
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	if err != nil {
		return ""
	}
	var kv []string
	for _, name := range strings.Split(string(buf[:sz]), "\x00") {
		if name == "" || ovl.IsPrivate(name) || strings.HasPrefix(name, "security.selinux") {
			continue
		}
		v := make([]byte, 256)
		n, err := unix.Lgetxattr(p, name, v)
		if err != nil {
			continue
		}
		kv = append(kv, name+"="+string(v[:n]))
	}
	sort.Strings(kv)
	return strings.Join(kv, ";")
}

// sameTree fails unless the two trees hold the same paths with the same
// type, mode, owner, content, link targets, devices, xattrs and hard-link
// grouping.
func sameTree(t *testing.T, what, got, want string) {
	t.Helper()
	a, b := snapshot(t, got), snapshot(t, want)
	var diffs []string
	for p, n := range b {
		m, ok := a[p]
		switch {
		case !ok:
			diffs = append(diffs, "missing "+p)
		case m != n:
			diffs = append(diffs, fmt.Sprintf("%s: got %+v want %+v", p, m, n))
		}
	}
	for p := range a {
		if _, ok := b[p]; !ok {
			diffs = append(diffs, "extra "+p)
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		t.Errorf("%s differs from the reference:\n  %s", what, strings.Join(diffs, "\n  "))
	}
}

// paths lists the paths of a tree, sorted.
func paths(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	for p := range snapshot(t, root) {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

func isErrno(err error, e unix.Errno) bool { return errors.Is(err, e) }

var _ = layer.ChangeAdd
