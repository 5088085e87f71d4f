//go:build ovlkit_guest

// Package copyup proves the copy-up part of the series: the fsync= mount
// option, the overlayfs tracepoints and the copy-up statistics in
// /proc/self/mountstats, and benchmarks what they cost.
package copyup

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ovlkit/ovlkit/ovl"
	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// Subjects of the patches these tests prove, exactly as in patches/6.1.
const (
	subjectFsync = "ovl: add fsync=auto|strict|volatile mount option"
	subjectTrace = "ovl: add tracepoints for copy-up and upper fs feature probing"
)

// splitLayers makes overlay layers whose upper and work directories are on
// upper while the lower layer is on a fresh tmpfs. Copy-up then has to copy
// the data: it cannot clone across filesystems.
func splitLayers(t testing.TB, upper guesttest.FS) guesttest.Layers {
	t.Helper()
	l := guesttest.NewLayers(t, upper.Scratch(t, ""), 1)
	lowerBase := guesttest.FS{Name: "tmpfs"}.Scratch(t, "")
	l.Lower[0] = filepath.Join(lowerBase, "lower")
	guestfs.Mkdir(t, l.Lower[0], 0o755)
	return l
}

// writeFile writes size bytes of a pattern that is never all zeros, so no
// part of the file can be mistaken for a hole.
func writeFile(t testing.TB, path string, size int, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, pattern(size), mode); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatalf("chmod %s: %v", path, err)
	}
}

func pattern(size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i%251 + 1)
	}
	return b
}

func chown(t testing.TB, path string, uid, gid int) {
	t.Helper()
	if err := os.Lchown(path, uid, gid); err != nil {
		t.Fatalf("chown %s: %v", path, err)
	}
}

// openForWrite opens path for writing and closes it again: that is what
// copies a lower file up.
func openForWrite(t testing.TB, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("open %s for write: %v", path, err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close %s: %v", path, err)
	}
}

// sameContent fails the test unless the two files hold the same bytes.
func sameContent(t testing.TB, a, b string) {
	t.Helper()
	ba, bb := guestfs.ReadFile(t, a), guestfs.ReadFile(t, b)
	if !bytes.Equal(ba, bb) {
		t.Fatalf("%s (%d bytes) and %s (%d bytes) differ", a, len(ba), b, len(bb))
	}
}

// superOptions returns the superblock options of the mount at mountPoint
// as /proc/self/mountinfo shows them (what ->show_options printed).
func superOptions(t testing.TB, mountPoint string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatalf("read mountinfo: %v", err)
	}
	found := ""
	ok := false
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, cut := strings.Cut(line, " - ")
		if !cut {
			continue
		}
		f := strings.Fields(pre)
		g := strings.Fields(post)
		if len(f) < 5 || len(g) < 3 || ovl.UnescapeMountField(f[4]) != mountPoint {
			continue
		}
		found, ok = g[2], true // the last mount on a point is the visible one
	}
	if !ok {
		t.Fatalf("%s is not in /proc/self/mountinfo", mountPoint)
	}
	return found
}

// optionSet splits a mount option string, dropping the options that name
// directories, which differ between any two test mounts.
func optionSet(opts string) []string {
	var out []string
	for _, o := range strings.Split(opts, ",") {
		k, _, _ := strings.Cut(o, "=")
		switch k {
		case "lowerdir", "upperdir", "workdir":
			continue
		}
		out = append(out, o)
	}
	return out
}
