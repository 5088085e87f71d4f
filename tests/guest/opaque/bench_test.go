//go:build ovlkit_guest

package opaque

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// benchEntries is the size of the directory read by the readdir
// benchmarks: large enough that the per-entry cost dominates the open.
const benchEntries = 10000

// benchDir mounts an overlay whose upper d holds benchEntries empty files
// and, when opaque, carries the opaque xattr, over a lower layer with a
// d of its own (so that the opaque xattr is what keeps d unmerged).
func benchDir(b *testing.B, fs guesttest.FS, opaque bool) string {
	b.Helper()
	l := guesttest.NewLayers(b, fs.Scratch(b, ""), 1)
	mkdir(b, filepath.Join(l.Lower[0], "d"))
	writeFile(b, filepath.Join(l.Lower[0], "d", "below"), "lower\n")
	d := filepath.Join(l.Upper, "d")
	mkdir(b, d)
	for i := 0; i < benchEntries; i++ {
		f, err := os.Create(filepath.Join(d, fmt.Sprintf("f%05d", i)))
		if err != nil {
			b.Fatalf("create entry %d: %v", i, err)
		}
		f.Close()
	}
	if opaque {
		setXattr(b, d, trustedNS.opaque(), "y")
	}
	l.Mount(b)
	return merged(l, "d")
}

// readAll is one readdir pass as ls or a tree walker does it: open, read
// every name, close. Closing drops overlayfs' cached name list, so every
// pass pays for building it.
func readAll(b *testing.B, dir string, want int) {
	f, err := os.Open(dir)
	if err != nil {
		b.Fatalf("open %s: %v", dir, err)
	}
	got, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		b.Fatalf("readdir %s: %v", dir, err)
	}
	if len(got) != want {
		b.Fatalf("readdir %s: %d entries, want %d", dir, len(got), want)
	}
}

// BenchmarkReaddirOpaque reads an opaque upper directory of 10,000
// entries: the path whose cost "ovl: hide stray whiteouts in opaque
// directories" changes.
func BenchmarkReaddirOpaque(b *testing.B) {
	benchReaddir(b, true, benchEntries)
}

// BenchmarkReaddirMerged reads the same directory without the opaque
// xattr, merged with the lower d: the reference for what the merged
// readdir path costs on any kernel.
func BenchmarkReaddirMerged(b *testing.B) {
	benchReaddir(b, false, benchEntries+1)
}

func benchReaddir(b *testing.B, opaque bool, want int) {
	for _, fs := range guesttest.Filesystems() {
		b.Run(fs.Name, func(b *testing.B) {
			dir := benchDir(b, fs, opaque)
			readAll(b, dir, want) // warm the dentry and inode caches
			for b.Loop() {
				readAll(b, dir, want)
			}
		})
	}
}
