//go:build ovlkit_guest

package graphsuite

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/ovl"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// The layout benchmarks measure what the hardlink layout (the 2014 design)
// costs against the overlay layout: inodes and time to create an image
// layer on a parent of 1,000 files, mount latency, removal, and whether N
// containers reading one file share its page cache.

const (
	benchDirs  = 100
	benchFiles = 10 // per directory
)

// benchTar is an image of benchDirs directories of benchFiles small files.
func benchTar(tb testing.TB) []byte {
	var es []entry
	for d := 0; d < benchDirs; d++ {
		es = append(es, dirE(fmt.Sprintf("d%03d/", d)))
		for f := 0; f < benchFiles; f++ {
			es = append(es, file(fmt.Sprintf("d%03d/f%d", d, f), strings.Repeat("x", 512)))
		}
	}
	es = append(es, file("big", strings.Repeat("b", 8<<20)))
	return mkTar(tb, es...)
}

func benchStore(b *testing.B, fs guesttest.FS, layout graph.Layout) *graph.Store {
	b.Helper()
	f, err := ovl.Probe(fs.Scratch(b, ""))
	if err != nil {
		b.Fatal(err)
	}
	home := filepath.Join(fs.Scratch(b, ""), "store")
	s, err := graph.Open(home, graph.Options{Create: true, Layout: layout, Sync: graph.SyncNone, Features: &f})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Cleanup(); s.Close() })
	if err := s.Create(context.Background(), "image", ""); err != nil {
		b.Fatal(err)
	}
	if _, err := s.ApplyDiff(context.Background(), "image", bytes.NewReader(benchTar(b))); err != nil {
		b.Fatal(err)
	}
	return s
}

// usedInodes is what statfs counts as used; btrfs allocates inodes
// dynamically and reports no totals, so its figure is 0.
func usedInodes(b *testing.B, dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		b.Fatal(err)
	}
	return int64(st.Files) - int64(st.Ffree)
}

func forEachBenchLayout(b *testing.B, fn func(b *testing.B, fs guesttest.FS, s *graph.Store)) {
	for _, fs := range guesttest.Filesystems() {
		fs := fs
		b.Run(fs.Name, func(b *testing.B) {
			for _, l := range layouts {
				l := l
				b.Run(string(l), func(b *testing.B) { fn(b, fs, benchStore(b, fs, l)) })
			}
		})
	}
}

// BenchmarkLayoutCreate: Create of an image layer on the 1,000-file image
// plus ApplyDiff of a one-file tar, with the inodes each layer costs.
func BenchmarkLayoutCreate(b *testing.B) {
	small := mkTar(b, file("etc/motd", "hello"))
	forEachBenchLayout(b, func(b *testing.B, fs guesttest.FS, s *graph.Store) {
		before := usedInodes(b, s.Home())
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			id := fmt.Sprintf("child-%d", i)
			if err := s.Create(context.Background(), id, "image"); err != nil {
				b.Fatal(err)
			}
			if _, err := s.ApplyDiff(context.Background(), id, bytes.NewReader(small)); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(usedInodes(b, s.Home())-before)/float64(b.N), "inodes/layer")
	})
}

// BenchmarkLayoutGetPut: mount and unmount a container layer.
func BenchmarkLayoutGetPut(b *testing.B) {
	forEachBenchLayout(b, func(b *testing.B, fs guesttest.FS, s *graph.Store) {
		if err := s.CreateReadWrite(context.Background(), "ctr", "image"); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := s.Get(context.Background(), "ctr"); err != nil {
				b.Fatal(err)
			}
			if err := s.Put(context.Background(), "ctr"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkLayoutRemove: remove an image layer made on the 1,000-file
// image (creation not timed).
func BenchmarkLayoutRemove(b *testing.B) {
	forEachBenchLayout(b, func(b *testing.B, fs guesttest.FS, s *graph.Store) {
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			id := fmt.Sprintf("child-%d", i)
			b.StopTimer()
			if err := s.Create(context.Background(), id, "image"); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if err := s.Remove(context.Background(), id); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func cachedKiB(b *testing.B) int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Cached:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("no Cached in /proc/meminfo")
	return 0
}

// BenchmarkLayoutPageCache: 8 container layers each read the image's
// 8 MiB file; the page cache should hold it once. The file's pages are
// dropped first with fadvise so every iteration starts cold. On tmpfs the
// file lives in the page cache and cannot be dropped, so its figure is 0.
func BenchmarkLayoutPageCache(b *testing.B) {
	const containers = 8
	forEachBenchLayout(b, func(b *testing.B, fs guesttest.FS, s *graph.Store) {
		var roots []string
		for c := 0; c < containers; c++ {
			id := fmt.Sprintf("ctr-%d", c)
			if err := s.CreateReadWrite(context.Background(), id, "image"); err != nil {
				b.Fatal(err)
			}
			p, err := s.Get(context.Background(), id)
			if err != nil {
				b.Fatal(err)
			}
			roots = append(roots, p)
		}
		var grown int64
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for _, r := range roots {
				dropCache(b, filepath.Join(r, "big"))
			}
			before := cachedKiB(b)
			for _, r := range roots {
				if _, err := os.ReadFile(filepath.Join(r, "big")); err != nil {
					b.Fatal(err)
				}
			}
			grown += cachedKiB(b) - before
		}
		b.StopTimer()
		b.ReportMetric(float64(grown)/float64(b.N)/1024, "cached-MiB")
		for c := 0; c < containers; c++ {
			s.Put(context.Background(), fmt.Sprintf("ctr-%d", c))
		}
	})
}

// dropCache drops the clean pages of the file behind an overlay path:
// fadvise on the overlay file reaches the real inode.
func dropCache(b *testing.B, path string) {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		b.Fatalf("fadvise %s: %v", path, err)
	}
}

// Durable apply: the cost of the store's default sync policy on a layer
// of many small entries, where syncing dominates the time.
const (
	durableDirs  = 1000
	durableFiles = 59 // per directory
	durableLinks = 40 // hard links per directory, to files of that directory
)

// durableTar is a layer of 100,000 entries: 1,000 directories, 59,000
// files of 32 bytes and 40,000 hard links. The links stand in for files
// because the guest's 1 GiB ext4 disk has 65,536 inodes; a hard link is a
// tar entry and a directory entry to write and sync like any other, but
// not an inode. USTAR headers keep the tar at one block per entry plus
// one per file's content.
func durableTar(tb testing.TB) []byte {
	var buf bytes.Buffer
	buf.Grow(durableDirs*(1+durableFiles*2+durableLinks)*512 + 1024)
	tw := tar.NewWriter(&buf)
	body := []byte(strings.Repeat("s", 32))
	hdr := func(h *tar.Header) {
		h.Format = tar.FormatUSTAR
		if err := tw.WriteHeader(h); err != nil {
			tb.Fatal(err)
		}
	}
	for d := 0; d < durableDirs; d++ {
		dir := fmt.Sprintf("d%04d/", d)
		hdr(&tar.Header{Name: dir, Typeflag: tar.TypeDir, Mode: 0o755})
		for f := 0; f < durableFiles; f++ {
			hdr(&tar.Header{Name: fmt.Sprintf("%sf%02d", dir, f), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
			if _, err := tw.Write(body); err != nil {
				tb.Fatal(err)
			}
		}
		for l := 0; l < durableLinks; l++ {
			hdr(&tar.Header{Name: fmt.Sprintf("%sl%02d", dir, l), Typeflag: tar.TypeLink, Linkname: fmt.Sprintf("%sf%02d", dir, l)})
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkApplyDurable: ApplyDiff of the 100,000-entry layer into a
// fresh image layer of a store with the default sync policy, on every
// disk filesystem (tmpfs has nothing to sync). Create and Remove are not
// timed; a sync(2) before each apply starts it with nothing dirty.
func BenchmarkApplyDurable(b *testing.B) {
	tarball := durableTar(b)
	for _, fs := range guesttest.Filesystems() {
		if fs.Device == "" {
			continue
		}
		fs := fs
		b.Run(fs.Name, func(b *testing.B) {
			f, err := ovl.Probe(fs.Scratch(b, ""))
			if err != nil {
				b.Fatal(err)
			}
			s, err := graph.Open(filepath.Join(fs.Scratch(b, ""), "store"), graph.Options{Create: true, Features: &f})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Cleanup(); s.Close() })
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				id := fmt.Sprintf("layer-%d", i)
				if err := s.Create(context.Background(), id, ""); err != nil {
					b.Fatal(err)
				}
				unix.Sync()
				b.StartTimer()
				if _, err := s.ApplyDiff(context.Background(), id, bytes.NewReader(tarball)); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := s.Remove(context.Background(), id); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
