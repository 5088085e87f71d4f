//go:build ovlkit_guest

package snapshottersuite

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/containerd/v2/plugins/snapshots/overlay"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/ovl"
	"github.com/ovlkit/ovlkit/snapshotter"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// contenders are the snapshotters the benchmarks compare, side by side in
// one boot on one filesystem: containerd's overlay snapshotter (which
// flushes its bolt metadata and none of its directories), and ovlkit's
// with the store's two sync policies.
func contenders(f *ovl.Features) []struct {
	name string
	open func(root string) (snapshots.Snapshotter, error)
} {
	ovlkit := func(sync graph.SyncPolicy) func(string) (snapshots.Snapshotter, error) {
		return func(root string) (snapshots.Snapshotter, error) {
			return snapshotter.Open(context.Background(), root, snapshotter.Config{Features: f, Sync: sync})
		}
	}
	return []struct {
		name string
		open func(root string) (snapshots.Snapshotter, error)
	}{
		{"containerd-overlayfs", func(root string) (snapshots.Snapshotter, error) { return overlay.NewSnapshotter(root) }},
		{"ovlkit-sync-none", ovlkit(graph.SyncNone)},
		{"ovlkit-sync-fsync", ovlkit(graph.SyncFsync)},
	}
}

// benchFS runs fn for each filesystem and snapshotter, each with a
// snapshotter of its own in a fresh directory.
func benchFS(b *testing.B, fn func(b *testing.B, sn snapshots.Snapshotter, work string)) {
	for _, fs := range guesttest.Filesystems() {
		if fs.Name == "xfs-ftype0" || fs.Name == "vfat" {
			continue
		}
		b.Run(fs.Name, func(b *testing.B) {
			f, err := ovl.Probe(fs.Scratch(b, ""))
			if err != nil {
				b.Fatal(err)
			}
			for _, c := range contenders(&f) {
				b.Run(c.name, func(b *testing.B) {
					root := scratch(b, fs)
					sn, err := c.open(root + "/sn")
					if err != nil {
						b.Fatal(err)
					}
					defer sn.Close()
					fn(b, sn, b.TempDir())
				})
			}
		})
	}
}

// layerTar is a tar layer of n files of 4 KiB in 10 directories, with a
// whiteout of a file of the layer below and an opaque directory.
func layerTar(b *testing.B, i, n int) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body []byte) {
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			b.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			b.Fatal(err)
		}
	}
	body := bytes.Repeat([]byte{byte('a' + i)}, 4096)
	for d := 0; d < 10; d++ {
		add(&tar.Header{Name: fmt.Sprintf("d%d/", d), Typeflag: tar.TypeDir, Mode: 0o755}, nil)
		for f := 0; f < n/10; f++ {
			add(&tar.Header{Name: fmt.Sprintf("d%d/l%d-f%d", d, i, f), Typeflag: tar.TypeReg, Mode: 0o644}, body)
		}
	}
	if i > 0 {
		add(&tar.Header{Name: fmt.Sprintf("d0/.wh.l%d-f0", i-1), Typeflag: tar.TypeReg, Mode: 0o644}, nil)
		add(&tar.Header{Name: "d9/.wh..wh..opq", Typeflag: tar.TypeReg, Mode: 0o644}, nil)
	}
	if err := tw.Close(); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

// unpack applies layers as containerd's unpacker does with any
// snapshotter: Prepare on the last, mount, apply the tar, Commit. It
// returns the last committed name.
func unpack(ctx context.Context, b *testing.B, sn snapshots.Snapshotter, prefix string, layers [][]byte) string {
	parent := ""
	for i, l := range layers {
		key, name := fmt.Sprintf("%s-extract-%d", prefix, i), fmt.Sprintf("%s-layer-%d", prefix, i)
		m, err := sn.Prepare(ctx, key, parent)
		if err != nil {
			b.Fatal(err)
		}
		err = mount.WithTempMount(ctx, m, func(root string) error {
			_, err := archive.Apply(ctx, root, bytes.NewReader(l))
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		if err := sn.Commit(ctx, name, key); err != nil {
			b.Fatal(err)
		}
		parent = name
	}
	return parent
}

// removeChain removes committed layers top first.
func removeChain(ctx context.Context, b *testing.B, sn snapshots.Snapshotter, prefix string, n int) {
	for i := n - 1; i >= 0; i-- {
		if err := sn.Remove(ctx, fmt.Sprintf("%s-layer-%d", prefix, i)); err != nil {
			b.Fatal(err)
		}
	}
}

// What starting a container costs the snapshotter: Prepare on a
// five-layer image, mount, unmount, Remove.
func BenchmarkPrepareMountRemove(b *testing.B) {
	ctx := context.Background()
	benchFS(b, func(b *testing.B, sn snapshots.Snapshotter, work string) {
		layers := make([][]byte, 5)
		for i := range layers {
			layers[i] = layerTar(b, i, 20)
		}
		top := unpack(ctx, b, sn, "img", layers)
		target := work + "/rootfs"
		if err := os.Mkdir(target, 0o755); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			key := fmt.Sprintf("ctr-%d", i)
			m, err := sn.Prepare(ctx, key, top)
			if err != nil {
				b.Fatal(err)
			}
			if err := mount.All(m, target); err != nil {
				b.Fatal(err)
			}
			if err := mount.UnmountAll(target, 0); err != nil {
				b.Fatal(err)
			}
			if err := sn.Remove(ctx, key); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		removeChain(ctx, b, sn, "img", len(layers))
	})
}

// Unpacking an image of five layers of 200 files each (with a whiteout
// and an opaque directory per layer above the first) through the
// snapshotter, then removing it untimed.
func BenchmarkUnpack(b *testing.B) {
	ctx := context.Background()
	layers := make([][]byte, 5)
	for i := range layers {
		layers[i] = layerTar(b, i, 200)
	}
	benchFS(b, func(b *testing.B, sn snapshots.Snapshotter, _ string) {
		for i := 0; i < b.N; i++ {
			prefix := fmt.Sprintf("img%d", i)
			unpack(ctx, b, sn, prefix, layers)
			b.StopTimer()
			removeChain(ctx, b, sn, prefix, len(layers))
			b.StartTimer()
		}
	})
}
