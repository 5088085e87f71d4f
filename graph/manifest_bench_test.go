package graph

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"testing"

	"github.com/ovlkit/ovlkit/layer"
)

// BenchmarkManifest measures what ApplyDiff adds to layer.Apply to record
// a manifest: the walk of the applied tree that builds it, and its
// encoding. The layer has 1,000 files of up to 64 KiB in 26 directories.
// The hashing itself happens inside Apply (layer's BenchmarkApply/+digest).
func BenchmarkManifest(b *testing.B) {
	rng := rand.New(rand.NewSource(1))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	body := make([]byte, 64<<10)
	rng.Read(body)
	for d := 0; d < 26; d++ {
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("d%02d/", d), Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < 1000; i++ {
		n := rng.Intn(len(body))
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("d%02d/f%04d", i%26, i), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(n)}); err != nil {
			b.Fatal(err)
		}
		if _, err := tw.Write(body[:n]); err != nil {
			b.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		b.Fatal(err)
	}
	root := b.TempDir()
	digests := map[inodeID]layer.FileDigest{}
	opts := layer.ApplyOptions{Digest: func(d layer.FileDigest) { digests[inodeID{dev: d.Dev, ino: d.Ino}] = d }}
	if _, err := layer.Apply(context.Background(), root, bytes.NewReader(buf.Bytes()), opts); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		entries, err := buildManifest(context.Background(), root, digests)
		if err != nil {
			b.Fatal(err)
		}
		if len(encodeManifest(entries)) == 0 {
			b.Fatal("empty manifest")
		}
	}
}
