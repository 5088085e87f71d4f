package layer

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// baseTime is a fixed mtime with nanoseconds, so that tests catch a
// round trip that drops sub-second precision.
var baseTime = time.Unix(1700000000, 123456789)

// ent is one tar entry of a test layer.
type ent struct {
	hdr  tar.Header
	body string
}

func reg(name, body string, mode int64) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), ModTime: baseTime}, body: body}
}

func dir(name string, mode int64) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: baseTime}}
}

func symlink(name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: baseTime}}
}

func hardlink(name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, ModTime: baseTime}}
}

// mkTar writes entries as a PAX tar.
func mkTar(t testing.TB, entries ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("write header %s: %v", h.Name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatalf("write body %s: %v", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func zstded(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func applyBytes(t testing.TB, root string, b []byte, opts ApplyOptions) (int64, error) {
	t.Helper()
	return Apply(context.Background(), root, bytes.NewReader(b), opts)
}

func mustApply(t testing.TB, root string, b []byte, opts ApplyOptions) int64 {
	t.Helper()
	n, err := applyBytes(t, root, b, opts)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return n
}

// describe renders one filesystem entry with everything a layer carries:
// type, permissions, owner, mtime (non-directories), size and content
// hash, link target, device number and xattrs (overlay ones included, so
// tests see markers).
func describe(t testing.TB, full string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(full, &st); err != nil {
		t.Fatalf("lstat %s: %v", full, err)
	}
	var b strings.Builder
	mode := st.Mode & 0o7777
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		fmt.Fprintf(&b, "dir %04o %d:%d", mode, st.Uid, st.Gid)
	case unix.S_IFREG:
		data, err := os.ReadFile(full)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "file %04o %d:%d %d %x mtime=%d.%09d", mode, st.Uid, st.Gid, st.Size, sha256.Sum256(data), st.Mtim.Sec, st.Mtim.Nsec)
	case unix.S_IFLNK:
		target, err := os.Readlink(full)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "symlink %d:%d -> %s mtime=%d.%09d", st.Uid, st.Gid, target, st.Mtim.Sec, st.Mtim.Nsec)
	case unix.S_IFCHR:
		fmt.Fprintf(&b, "char %04o %d:%d %d:%d", mode, st.Uid, st.Gid, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	case unix.S_IFBLK:
		fmt.Fprintf(&b, "block %04o %d:%d %d:%d", mode, st.Uid, st.Gid, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	case unix.S_IFIFO:
		fmt.Fprintf(&b, "fifo %04o %d:%d", mode, st.Uid, st.Gid)
	default:
		fmt.Fprintf(&b, "other %o", st.Mode)
	}
	for _, x := range allXattrs(t, full) {
		b.WriteString(" " + x)
	}
	return b.String()
}

// allXattrs lists every xattr including overlay ones as name=value.
func allXattrs(t testing.TB, full string) []string {
	t.Helper()
	sz, err := unix.Llistxattr(full, nil)
	if err != nil || sz == 0 {
		return nil
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(full, buf)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, name := range strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00") {
		v, _, err := lgetxattr(full, name)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, name+"="+string(v))
	}
	sort.Strings(out)
	return out
}

// tree lists root recursively: "path: description", sorted, root excluded.
func tree(t testing.TB, root string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		out = append(out, rel+": "+describe(t, p))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// fullTree is tree with the root's own description first: a round trip
// must also carry the root's metadata and opaque marker.
func fullTree(t testing.TB, root string) []string {
	t.Helper()
	return append([]string{".: " + describe(t, root)}, tree(t, root)...)
}

// tarHeaders lists the headers of a tar stream.
func tarHeaders(t testing.TB, b []byte) []*tar.Header {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var out []*tar.Header
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("read tar: %v", err)
		}
		out = append(out, h)
	}
}

// tarNames lists the entry names of a tar stream.
func tarNames(t testing.TB, b []byte) []string {
	var out []string
	for _, h := range tarHeaders(t, b) {
		out = append(out, h.Name)
	}
	return out
}

func equalLists(t testing.TB, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s:\ngot:\n  %s\nwant:\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func mkdirs(t testing.TB, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func writeFile(t testing.TB, p, body string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, baseTime, baseTime); err != nil {
		t.Fatal(err)
	}
}

func mkWhiteout(t testing.TB, p string) {
	t.Helper()
	if err := unix.Mknod(p, unix.S_IFCHR, 0); err != nil {
		t.Fatalf("mknod whiteout %s: %v", p, err)
	}
}

func setXattr(t testing.TB, p, name, value string) {
	t.Helper()
	if err := unix.Lsetxattr(p, name, []byte(value), 0); err != nil {
		t.Fatalf("setxattr %s %s: %v", p, name, err)
	}
}

func changeStrings(cs []Change) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, c.String())
	}
	return out
}

func sha(s string) string { return fmt.Sprintf("%x", sha256.Sum256([]byte(s))) }

func itoa(i int) string { return fmt.Sprint(i) }
