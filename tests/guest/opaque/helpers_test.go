//go:build ovlkit_guest

// Package opaque proves the opaque-xattr part of the series: stray
// whiteouts inside opaque directories are hidden and removable, and the
// value of the opaque xattr is validated instead of silently meaning "not
// opaque".
package opaque

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// Subjects of the patches these tests prove, exactly as in patches/6.1.
const (
	subjectHideWhiteouts = "ovl: hide stray whiteouts in opaque directories"
	subjectValidate      = "ovl: validate the opaque xattr value"
)

// xattrNS is one namespace overlayfs keeps its private xattrs in.
type xattrNS struct {
	name  string   // "trusted" or "user"
	mount []string // extra mount options selecting it
}

func (ns xattrNS) opaque() string { return ns.name + ".overlay.opaque" }

var (
	trustedNS = xattrNS{name: "trusted"}
	userNS    = xattrNS{name: "user", mount: []string{"userxattr"}}
)

// namespaces lists the xattr namespaces fs can hold overlay xattrs in.
// tmpfs gained user.* xattrs only in 6.6, so on 6.1 the userxattr variant
// needs a disk filesystem.
func namespaces(fs guesttest.FS) []xattrNS {
	if fs.Device == "" {
		return []xattrNS{trustedNS}
	}
	return []xattrNS{trustedNS, userNS}
}

// forEachNS runs fn as a subtest per filesystem and namespace.
func forEachNS(t *testing.T, fn func(t *testing.T, fs guesttest.FS, ns xattrNS)) {
	t.Helper()
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		for _, ns := range namespaces(fs) {
			t.Run(ns.name, func(t *testing.T) { fn(t, fs, ns) })
		}
	})
}

// whiteout makes the 0/0 character device overlayfs uses as a whiteout,
// the way layer tools write one straight into a layer.
func whiteout(t testing.TB, path string) {
	t.Helper()
	if err := unix.Mknod(path, unix.S_IFCHR, int(unix.Mkdev(0, 0))); err != nil {
		t.Fatalf("mknod whiteout %s: %v", path, err)
	}
}

func setXattr(t testing.TB, path, name, value string) {
	t.Helper()
	if err := unix.Lsetxattr(path, name, []byte(value), 0); err != nil {
		t.Fatalf("setxattr %s=%q on %s: %v", name, value, path, err)
	}
}

func expectNames(t testing.TB, dir string, want ...string) {
	t.Helper()
	sort.Strings(want)
	if got := guestfs.Names(t, dir); !slices.Equal(got, want) {
		t.Errorf("readdir %s = %q, want %q", dir, got, want)
	}
}

// expectENOENT checks that path does not exist, with the errno the
// kernel gives rather than any error.
func expectENOENT(t testing.TB, path string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); !errors.Is(err, unix.ENOENT) {
		t.Errorf("lstat %s: err %v (mode %o), want ENOENT", path, err, st.Mode)
	}
}

// isWhiteout reports whether path is a 0/0 character device.
func isWhiteout(t testing.TB, path string) bool {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatalf("lstat %s: %v", path, err)
	}
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// kmsgMatches returns the kernel messages logged since the last read that
// contain every one of parts. Overlayfs prints its warnings from the
// syscall that triggers them, so no waiting is needed.
func kmsgMatches(t testing.TB, k *guesttest.Kmsg, parts ...string) (match, all []string) {
	t.Helper()
	for _, l := range k.Lines(t) {
		all = append(all, l)
		ok := true
		for _, p := range parts {
			if !strings.Contains(l, p) {
				ok = false
				break
			}
		}
		if ok {
			match = append(match, l)
		}
	}
	return match, all
}

// merged returns the path of name inside the overlay.
func merged(l guesttest.Layers, name ...string) string {
	return filepath.Join(append([]string{l.Merged}, name...)...)
}

// dirent is one entry as getdents64 returns it.
type dirent struct {
	name string
	ino  uint64
	off  int64 // d_off: the position after this entry
}

// getdents reads entries from fd with a buffer of bufSize bytes, one
// getdents64 call at a time, until at least stopAfter entries were read
// (all of them when stopAfter <= 0). A small buffer makes the calls, and
// so the positions they leave, the same for every open of one directory.
func getdents(fd, bufSize, stopAfter int) ([]dirent, error) {
	buf := make([]byte, bufSize)
	var out []dirent
	for stopAfter <= 0 || len(out) < stopAfter {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return out, fmt.Errorf("getdents64: %w", err)
		}
		if n == 0 {
			break
		}
		for b := buf[:n]; len(b) > 0; {
			// struct linux_dirent64: u64 d_ino, s64 d_off, u16 d_reclen,
			// u8 d_type, then the NUL-terminated name.
			if len(b) < 19 {
				return out, fmt.Errorf("getdents64: short record of %d bytes", len(b))
			}
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				return out, fmt.Errorf("getdents64: bad d_reclen %d", reclen)
			}
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			out = append(out, dirent{
				name: string(name),
				ino:  binary.NativeEndian.Uint64(b[0:8]),
				off:  int64(binary.NativeEndian.Uint64(b[8:16])),
			})
			b = b[reclen:]
		}
	}
	return out, nil
}

// direntNames returns the names of ds in the order read.
func direntNames(ds []dirent) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.name
	}
	return out
}

// seekResult is what lseek returned: a position or an errno, rendered so
// that two results compare with == and print readably.
func seekResult(off int64, err error) string {
	if err != nil {
		var errno unix.Errno
		if errors.As(err, &errno) {
			return "errno " + unix.ErrnoName(errno)
		}
		return "error " + err.Error()
	}
	return fmt.Sprintf("offset %d", off)
}

// seekEnd opens dir, seeks to its end and reports the result.
func seekEnd(t testing.TB, dir string) string {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	defer unix.Close(fd)
	return seekResult(unix.Seek(fd, 0, unix.SEEK_END))
}
