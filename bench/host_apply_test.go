package bench

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/moby/go-archive"

	"github.com/ovlkit/ovlkit/layer"
)

// hostLayers is BenchmarkApplyDiff's layer (5,000 files, 50 MiB, seed
// 1), plain and compressed as the guest compresses it with zstd, made once
// per test binary.
var hostLayers = sync.OnceValues(func() (map[string][]byte, error) {
	var plain bytes.Buffer
	if _, err := GenerateLayer(&plain, LayerSpec{Files: 5000, Bytes: 50 << 20, Seed: 1}); err != nil {
		return nil, err
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		return nil, err
	}
	return map[string][]byte{"plain": plain.Bytes(), "zstd": enc.EncodeAll(plain.Bytes(), nil)}, nil
})

// BenchmarkHostApplyZstd is BenchmarkApplyDiff's zstd case without an
// overlay, on the host: the store's apply, go-archive's Untar (what
// overlay2 runs) and the decode alone, and both appliers on the plain
// layer (what an apply costs beyond the decode), each into a fresh
// directory under
// OVLKIT_BENCH_DIR (the test's temporary directory by default; point it
// at a tmpfs to leave the disk out). Run it with -cpu 1 to match the
// guest's one vCPU, where the decoder decodes synchronously, and with
// -cpuprofile to see where an apply spends its time.
func BenchmarkHostApplyZstd(b *testing.B) {
	layers, err := hostLayers()
	if err != nil {
		b.Fatalf("generate layer: %v", err)
	}
	base := os.Getenv("OVLKIT_BENCH_DIR")
	if base == "" {
		base = b.TempDir()
	}
	contenders := []struct {
		name, codec string
		fn          func(dir string, r io.Reader) error
	}{
		{"ovlkit", "zstd", func(dir string, r io.Reader) error {
			_, err := layer.Apply(context.Background(), dir, r, layer.ApplyOptions{})
			return err
		}},
		{"goarchive-untar", "zstd", func(dir string, r io.Reader) error {
			return archive.Untar(r, dir, &archive.TarOptions{WhiteoutFormat: archive.OverlayWhiteoutFormat})
		}},
		{"zstd-decode-only", "zstd", func(_ string, r io.Reader) error {
			return decodeZstd(r)
		}},
		{"zstd-decode-only-2xwindow", "zstd", func(_ string, r io.Reader) error {
			return decodeZstd(r, zstd.WithDecoderLowmem(false))
		}},
	}
	contenders = append(contenders, contenders[0], contenders[1])
	for i := range contenders[4:] {
		c := &contenders[4+i]
		c.name, c.codec = c.name+"-plain", "plain"
	}
	for _, c := range contenders {
		b.Run(c.name, func(b *testing.B) {
			scratch, err := os.MkdirTemp(base, "apply-")
			if err != nil {
				b.Fatal(err)
			}
			defer os.RemoveAll(scratch)
			b.SetBytes(50 << 20)
			var cpu time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				dir := filepath.Join(scratch, "apply")
				if err := os.RemoveAll(dir); err != nil {
					b.Fatal(err)
				}
				if err := os.Mkdir(dir, 0o755); err != nil {
					b.Fatal(err)
				}
				start := cpuTime(b)
				b.StartTimer()
				if err := c.fn(dir, bytes.NewReader(layers[c.codec])); err != nil {
					b.Fatalf("%s: %v", c.name, err)
				}
				b.StopTimer()
				cpu += cpuTime(b) - start
				b.StartTimer()
			}
			// The process's CPU time (user and system) per apply: on a
			// shared host it varies less than the elapsed time, which
			// waits for the CPU as well.
			b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N), "cpu-ms/op")
		})
	}
}

func decodeZstd(r io.Reader, opts ...zstd.DOption) error {
	zr, err := zstd.NewReader(r, opts...)
	if err != nil {
		return err
	}
	defer zr.Close()
	_, err = io.Copy(io.Discard, zr)
	return err
}

// cpuTime is the user and system time the process has used.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
