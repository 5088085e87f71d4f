//go:build ovlkit_guest

package experiments

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// sharing is one way to give containers the same image data.
type sharing struct {
	name   string
	roots  []string // each container's view of the image
	origin string   // the image's own copy of the big file
}

// BenchmarkPageCache is experiment 2: N containers each read the same
// big file and a tree of small files after the caches were dropped, and
// the growth of Cached in /proc/meminfo is measured, for overlay (the
// store on ext4), Btrfs snapshots and plain copies on ext4. mincore(2)
// then tells whose pages are cached: for overlay the lower file's.
func BenchmarkPageCache(b *testing.B) {
	describe(b)
	c := loadConfig(b)
	rec := recorder{b, "pagecache"}
	maxN := 0
	for _, n := range c.pcNs {
		maxN = max(maxN, n)
	}
	bigSize := int64(c.pcFileMiB) << 20
	dirs, files := treeSpec("small", c.pcTreeFiles, 4096)
	files = append(files, tarFile{name: "big", size: bigSize})
	image := makeTar(b, dirs, files, 2)
	dataBytes := bigSize + int64(c.pcTreeFiles)*4096
	ctx := context.Background()

	// overlay: maxN container layers of the store on one image layer.
	s := openStore(b, guesttest.NeedFS(b, "ext4"), graph.LayoutOverlay, graph.SyncNone)
	addImage(b, s, "img", "", image)
	ov := sharing{name: "overlay-ext4", origin: filepath.Join(s.Home(), "layers", "img", "diff", "big")}
	for i := 0; i < maxN; i++ {
		id := fmt.Sprintf("c%02d", i)
		if err := s.CreateReadWrite(ctx, id, "img"); err != nil {
			b.Fatal(err)
		}
		root, err := s.Get(ctx, id)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if err := s.Put(ctx, id); err != nil {
				b.Errorf("unmount %s: %v", id, err)
			}
		})
		ov.roots = append(ov.roots, root)
	}

	// btrfs: maxN snapshots of one subvolume.
	bdir := guesttest.NeedFS(b, "btrfs").Scratch(b, "")
	bimg := btrfsImage(b, bdir, "img", image)
	bt := sharing{name: "btrfs-snapshot", origin: filepath.Join(bimg, "big")}
	for i := 0; i < maxN; i++ {
		id := fmt.Sprintf("s%02d", i)
		if err := BtrfsSnapshot(bimg, bdir, id); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if err := BtrfsSubvolDelete(bdir, id); err != nil {
				b.Errorf("%v", err)
			}
		})
		bt.roots = append(bt.roots, filepath.Join(bdir, id))
	}

	// copies: maxN full copies of the image directory on ext4.
	cdir := guesttest.NeedFS(b, "ext4").Scratch(b, "")
	cimg := filepath.Join(cdir, "img")
	applyTo(b, cimg, image)
	cp := sharing{name: "copy-ext4", origin: filepath.Join(cimg, "big")}
	for i := 0; i < maxN; i++ {
		root := filepath.Join(cdir, fmt.Sprintf("c%02d", i))
		if err := CopyTree(cimg, root); err != nil {
			b.Fatal(err)
		}
		cp.roots = append(cp.roots, root)
	}

	start := time.Now()
	for rep := 0; rep < c.reps; rep++ {
		for _, n := range c.pcNs {
			for _, sh := range []sharing{ov, bt, cp} {
				dropCaches(b)
				before, err := Cached()
				if err != nil {
					b.Fatal(err)
				}
				for _, root := range sh.roots[:n] {
					got, nfiles, err := ReadTree(root)
					if err != nil {
						b.Fatal(err)
					}
					if got != dataBytes || nfiles != c.pcTreeFiles+1 {
						b.Fatalf("%s: read %d bytes in %d files, want %d in %d", root, got, nfiles, dataBytes, c.pcTreeFiles+1)
					}
				}
				after, err := Cached()
				if err != nil {
					b.Fatal(err)
				}
				x := float64(n)
				growth := float64(after - before)
				rec.emit(sh.name, x, "cached_mib", "MiB", rep, growth/(1<<20))
				rec.emit(sh.name, x, "cached_per_image", "x", rep, growth/float64(dataBytes))
				// Whose pages: the image's own file, and the big file as
				// the first container sees it.
				res, pages, err := Resident(sh.origin)
				if err != nil {
					b.Fatal(err)
				}
				rec.emit(sh.name, x, "origin_resident_pct", "%", rep, 100*float64(res)/float64(pages))
				res, pages, err = Resident(filepath.Join(sh.roots[0], "big"))
				if err != nil {
					b.Fatal(err)
				}
				rec.emit(sh.name, x, "container_resident_pct", "%", rep, 100*float64(res)/float64(pages))
			}
		}
		b.Logf("page cache repetition %d done after %v", rep, time.Since(start).Round(time.Second))
	}
}
