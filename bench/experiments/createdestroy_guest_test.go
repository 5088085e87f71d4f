//go:build ovlkit_guest

package experiments

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// lifecycle is one way to make and throw away a container's root.
type lifecycle struct {
	name    string
	maxN    int // 0: every N
	create  func(tb testing.TB, id string)
	destroy func(tb testing.TB, id string)
}

func storeLifecycle(tb testing.TB, name, fsName string, layout graph.Layout, image []byte) lifecycle {
	s := openStore(tb, guesttest.NeedFS(tb, fsName), layout, graph.SyncFsync)
	addImage(tb, s, "img", "", image)
	ctx := context.Background()
	return lifecycle{
		name: name,
		create: func(tb testing.TB, id string) {
			if err := s.CreateReadWrite(ctx, id, "img"); err != nil {
				tb.Fatalf("%s: create %s: %v", name, id, err)
			}
			if _, err := s.Get(ctx, id); err != nil {
				tb.Fatalf("%s: mount %s: %v", name, id, err)
			}
		},
		destroy: func(tb testing.TB, id string) {
			if err := s.Put(ctx, id); err != nil {
				tb.Fatalf("%s: unmount %s: %v", name, id, err)
			}
			if err := s.Remove(ctx, id); err != nil {
				tb.Fatalf("%s: remove %s: %v", name, id, err)
			}
		},
	}
}

// BenchmarkCreateDestroy is experiment 1: create and mount N container
// layers on one image, then unmount and remove them, for the store's
// overlay layout on ext4 and xfs, its hardlink layout on ext4, a bare
// overlay mount on ext4 (mkdir, mount, umount, rm: the kernel's share),
// Btrfs snapshots and a plain copy of the image on ext4. It runs its own
// repetitions (run it with -benchtime=1x). A btrfs snapshot needs no
// mount: its create is the snapshot ioctl, its destroy the delete ioctl.
func BenchmarkCreateDestroy(b *testing.B) {
	describe(b)
	c := loadConfig(b)
	image := imageTar(b, c)
	rec := recorder{b, "createdestroy"}

	btrfsDir := guesttest.NeedFS(b, "btrfs").Scratch(b, "")
	btrfsImg := btrfsImage(b, btrfsDir, "img", image)
	copyDir := guesttest.NeedFS(b, "ext4").Scratch(b, "")
	copyImg := filepath.Join(copyDir, "img")
	applyTo(b, copyImg, image)

	cases := []lifecycle{
		storeLifecycle(b, "overlay-ext4", "ext4", graph.LayoutOverlay, image),
		storeLifecycle(b, "overlay-xfs", "xfs", graph.LayoutOverlay, image),
		storeLifecycle(b, "hardlink-ext4", "ext4", graph.LayoutHardlink, image),
		{
			name: "btrfs-snapshot",
			create: func(tb testing.TB, id string) {
				if err := BtrfsSnapshot(btrfsImg, btrfsDir, id); err != nil {
					tb.Fatal(err)
				}
			},
			destroy: func(tb testing.TB, id string) {
				if err := BtrfsSubvolDelete(btrfsDir, id); err != nil {
					tb.Fatal(err)
				}
			},
		},
		{
			// What any overlay driver must do, without the store's
			// lock, records and syncs: the kernel's share.
			name: "overlay-bare-ext4",
			create: func(tb testing.TB, id string) {
				d := filepath.Join(copyDir, id)
				if err := os.Mkdir(d, 0o755); err != nil {
					tb.Fatal(err)
				}
				mountOverlay(tb, copyImg, filepath.Join(d, "upper"), filepath.Join(d, "work"), filepath.Join(d, "merged"), "")
			},
			destroy: func(tb testing.TB, id string) {
				d := filepath.Join(copyDir, id)
				unmount(tb, filepath.Join(d, "merged"))
				if err := os.RemoveAll(d); err != nil {
					tb.Fatal(err)
				}
			},
		},
		{
			name: "copy-ext4",
			maxN: c.copyMaxN,
			create: func(tb testing.TB, id string) {
				if err := CopyTree(copyImg, filepath.Join(copyDir, id)); err != nil {
					tb.Fatal(err)
				}
			},
			destroy: func(tb testing.TB, id string) {
				if err := os.RemoveAll(filepath.Join(copyDir, id)); err != nil {
					tb.Fatal(err)
				}
			},
		},
	}
	start := time.Now()
	for rep := 0; rep < c.reps; rep++ {
		for _, n := range c.ns {
			// The contenders take turns within each repetition, so
			// that a slow phase of the host lands on all of them.
			for _, lc := range cases {
				if lc.maxN > 0 && n > lc.maxN {
					continue
				}
				ids := make([]string, n)
				for i := range ids {
					ids[i] = fmt.Sprintf("c%d-%04d", rep, i)
				}
				unix.Sync()
				t0 := time.Now()
				for _, id := range ids {
					lc.create(b, id)
				}
				tc := time.Since(t0)
				unix.Sync()
				t1 := time.Now()
				for _, id := range ids {
					lc.destroy(b, id)
				}
				td := time.Since(t1)
				x := float64(n)
				rec.emit(lc.name, x, "create_ms", "ms", rep, ms(tc)/x)
				rec.emit(lc.name, x, "destroy_ms", "ms", rep, ms(td)/x)
				rec.emit(lc.name, x, "cycle_ms", "ms", rep, ms(tc+td)/x)
				rec.emit(lc.name, x, "throughput", "containers/s", rep, x/(tc+td).Seconds())
			}
		}
		b.Logf("create/destroy repetition %d done after %v", rep, time.Since(start).Round(time.Second))
	}
}
