package bench

import (
	"context"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/moby/go-archive"

	"github.com/ovlkit/ovlkit/layer"
)

// BenchmarkHostDiffBase is graphtest's DiffBase without a driver, on the
// host: the tar of a directory holding moby's base layer (file-a, 64
// bytes; dir-b/file-b, 128; file-c, 16 KiB), read to the end, by the
// store's exporter and by go-archive's TarWithOptions (what overlay2's
// Diff returns), each through a pipe as the drivers stream it. It needs
// no overlay mount, so it runs where the guest does not; BenchmarkGraphtest
// measures the drivers themselves in the guest.
func BenchmarkHostDiffBase(b *testing.B) {
	dir := b.TempDir()
	rng := rand.New(rand.NewSource(3))
	for _, f := range []struct {
		name string
		size int
	}{{"file-a", 64}, {"dir-b/file-b", 128}, {"file-c", 128 * 128}} {
		data := make([]byte, f.size)
		rng.Read(data)
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f.name)), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f.name), data, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("ovlkit", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			pr, pw := io.Pipe()
			go func() {
				pw.CloseWithError(layer.Export(context.Background(), pw, dir,
					layer.ExportOptions{Whiteouts: layer.OverlayWhiteouts, Lowers: []string{}}))
			}()
			if _, err := io.Copy(io.Discard, pr); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("goarchive", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			rc, err := archive.TarWithOptions(dir, &archive.TarOptions{Compression: archive.Uncompressed, WhiteoutFormat: archive.OverlayWhiteoutFormat})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.Copy(io.Discard, rc); err != nil {
				b.Fatal(err)
			}
			rc.Close()
		}
	})
}
