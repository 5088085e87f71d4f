//go:build ovlkit_guest

package opaque

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// benchEntries is the size of the directory read by the readdir
// benchmarks: large enough that the per-entry cost dominates the open.
const benchEntries = 10000

// benchCharDevEvery makes every tenth entry of the char-device benchmark a
// character device that is not a whiteout, as device nodes in an image's
// /dev are.
const benchCharDevEvery = 10

// benchCopiedUp is how many entries of the impure benchmark directory are
// lower files moved in through the overlay (copied up with an origin).
const benchCopiedUp = 1000

// benchEntryName names entry i of a benchmark directory.
func benchEntryName(i int) string { return fmt.Sprintf("f%05d", i) }

// fillBenchDir creates entries from..to-1 in dir: empty files, or for
// every charDevEvery-th entry (when > 0) a 1:3 character device.
func fillBenchDir(b *testing.B, dir string, from, to, charDevEvery int) {
	b.Helper()
	guestfs.MkdirAll(b, dir)
	for i := from; i < to; i++ {
		p := filepath.Join(dir, benchEntryName(i))
		if charDevEvery > 0 && i%charDevEvery == 0 {
			if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
				b.Fatalf("mknod %s: %v", p, err)
			}
			continue
		}
		f, err := os.Create(p)
		if err != nil {
			b.Fatalf("create entry %d: %v", i, err)
		}
		f.Close()
	}
}

// benchLayers makes the layers of one benchmark on fs, with a d in the
// lower layer (holding "below") that an opaque upper d must hide.
func benchLayers(b *testing.B, fs guesttest.FS) guesttest.Layers {
	b.Helper()
	l := guesttest.NewLayers(b, fs.Scratch(b, ""), 1)
	guestfs.MkdirAll(b, filepath.Join(l.Lower[0], "d"))
	guestfs.WriteFile(b, filepath.Join(l.Lower[0], "d", "below"), "lower\n")
	return l
}

// benchDir mounts an overlay whose upper d holds benchEntries entries
// (every charDevEvery-th a character device) and, when opaque, carries
// the opaque xattr, over a lower layer with a d of its own (so that the
// opaque xattr is what keeps d unmerged).
func benchDir(b *testing.B, fs guesttest.FS, opaque bool, charDevEvery int) string {
	b.Helper()
	l := benchLayers(b, fs)
	d := filepath.Join(l.Upper, "d")
	fillBenchDir(b, d, 0, benchEntries, charDevEvery)
	if opaque {
		setXattr(b, d, trustedNS.opaque(), "y")
	}
	l.Mount(b)
	return merged(l, "d")
}

// benchImpureDir mounts, with redirect_dir=on, an overlay whose merge
// directory m holds d as mkdir in a merge directory makes it: opaque.
// benchEntries-benchCopiedUp of its entries are upper files; the others
// are lower files of m moved into d through the overlay, so they are
// copied up with an origin and d is impure. The overlay is then mounted
// again, so that d is looked up as after a reboot rather than reused from
// the cache mkdir and rename left.
func benchImpureDir(b *testing.B, fs guesttest.FS) string {
	b.Helper()
	l := guesttest.NewLayers(b, fs.Scratch(b, ""), 1)
	first := benchEntries - benchCopiedUp
	fillBenchDir(b, filepath.Join(l.Lower[0], "m"), first, benchEntries, 0)
	d := filepath.Join(l.Upper, "m", "d")
	fillBenchDir(b, d, 0, first, 0)
	setXattr(b, d, trustedNS.opaque(), "y")
	l.Mount(b, "redirect_dir=on")
	for i := first; i < benchEntries; i++ {
		n := benchEntryName(i)
		if err := os.Rename(merged(l, "m", n), merged(l, "m", "d", n)); err != nil {
			b.Fatalf("rename m/%s into m/d: %v", n, err)
		}
	}
	expectXattrY(b, d, trustedNS.name+".overlay.impure")
	l.Unmount(b)
	l.Mount(b, "redirect_dir=on")
	return merged(l, "m", "d")
}

// benchXinoDir mounts, with xino=on, an overlay whose lower layer is on a
// tmpfs of its own (xino maps inode numbers only across filesystems) and
// whose upper d on fs is opaque and holds benchEntries files.
func benchXinoDir(b *testing.B, fs guesttest.FS) string {
	b.Helper()
	l := guesttest.NewLayers(b, fs.Scratch(b, ""), 1)
	l.Lower[0] = guesttest.FS{Name: "tmpfs"}.Scratch(b, "")
	guestfs.MkdirAll(b, filepath.Join(l.Lower[0], "d"))
	guestfs.WriteFile(b, filepath.Join(l.Lower[0], "d", "below"), "lower\n")
	d := filepath.Join(l.Upper, "d")
	fillBenchDir(b, d, 0, benchEntries, 0)
	setXattr(b, d, trustedNS.opaque(), "y")
	l.Mount(b, "xino=on")
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

// The readdir benchmarks below read directories of 10,000 entries that
// differ in what overlayfs has to do per entry; the opaque ones are read
// from the real directory on a stock kernel. Each runs on every
// filesystem the guest has, as a sub-benchmark named after it.

// BenchmarkReaddirOpaque reads an opaque upper directory of 10,000 empty
// files: the path whose cost "ovl: hide stray whiteouts in opaque
// directories" changes.
func BenchmarkReaddirOpaque(b *testing.B) {
	benchReaddir(b, benchEntries, func(b *testing.B, fs guesttest.FS) string {
		return benchDir(b, fs, true, 0)
	})
}

// BenchmarkReaddirOpaqueCharDevs reads the opaque directory with every
// tenth entry a character device that is not a whiteout (1,000 of them):
// what hiding whiteouts costs when every char device must be checked.
func BenchmarkReaddirOpaqueCharDevs(b *testing.B) {
	benchReaddir(b, benchEntries, func(b *testing.B, fs guesttest.FS) string {
		return benchDir(b, fs, true, benchCharDevEvery)
	})
}

// BenchmarkReaddirOpaqueImpure reads an opaque directory made by mkdir in
// a merge directory (redirect_dir=on) that holds 1,000 copied-up entries:
// impure, so readdir reports the origin's inode number for those.
func BenchmarkReaddirOpaqueImpure(b *testing.B) {
	benchReaddir(b, benchEntries, benchImpureDir)
}

// BenchmarkReaddirOpaqueXino reads an opaque upper directory of an
// xino=on overlay whose lower layer is on another filesystem, so that
// readdir maps every d_ino.
func BenchmarkReaddirOpaqueXino(b *testing.B) {
	benchReaddir(b, benchEntries, benchXinoDir)
}

// BenchmarkReaddirMerged reads the plain directory without the opaque
// xattr, merged with the lower d: the reference for what the merged
// readdir path costs on any kernel.
func BenchmarkReaddirMerged(b *testing.B) {
	benchReaddir(b, benchEntries+1, func(b *testing.B, fs guesttest.FS) string {
		return benchDir(b, fs, false, 0)
	})
}

// benchReaddir times readAll of the directory setup makes, per filesystem.
func benchReaddir(b *testing.B, want int, setup func(b *testing.B, fs guesttest.FS) string) {
	for _, fs := range guesttest.Filesystems() {
		b.Run(fs.Name, func(b *testing.B) {
			dir := setup(b, fs)
			readAll(b, dir, want) // warm the dentry and inode caches
			for b.Loop() {
				readAll(b, dir, want)
			}
		})
	}
}
