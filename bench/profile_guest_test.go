//go:build ovlkit_guest

package bench

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// BenchmarkApplyZstdProfile profiles, in the guest, what BenchmarkApplyDiff
// measures for the zstd layer: the store's apply, go-archive's Untar and
// the decode alone (with the decoder's default history buffer and with
// one of twice the window), each into a fresh directory on the first of
// OVLKIT_BENCH_FS (tmpfs by default), one CPU profile per contender over
// its b.N applies. The
// guest has no channel back for files, so each profile is logged as
// base64 lines "pprof <contender>-<n> <chunk>", n counting the contender's
// runs (-count repeats each sub-benchmark, and the testing package may run
// one more than once to size it); cmd/benchprofile turns the run's
// JSON events back into profile files for go tool pprof. Each contender
// also reports its MB/s, so the profile can be read against the figures.
func BenchmarkApplyZstdProfile(b *testing.B) {
	d := testLayer(b)
	fs := benchFilesystems(b)[0]
	contenders := append(appliers[:2:2], decodeOnly, decodeOnlyHistory)
	for _, a := range contenders {
		b.Run(a.name, func(b *testing.B) {
			scratch := fs.Scratch(b, "")
			var prof bytes.Buffer
			if err := pprof.StartCPUProfile(&prof); err != nil {
				b.Fatal(err)
			}
			for i := 0; i < b.N; i++ {
				dir := filepath.Join(scratch, "apply")
				if err := os.Mkdir(dir, 0o755); err != nil {
					b.Fatal(err)
				}
				if err := a.fn(dir, bytes.NewReader(d.codecs["zstd"])); err != nil {
					b.Fatalf("%s apply: %v", a.name, err)
				}
				// In the profile under os.RemoveAll, which pprof
				// -ignore leaves out; not in the time.
				b.StopTimer()
				if err := os.RemoveAll(dir); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.StopTimer()
			pprof.StopCPUProfile()
			b.ReportMetric(float64(d.content)*float64(b.N)/1e6/b.Elapsed().Seconds(), "MB/s")
			profileRuns[a.name]++
			name := fmt.Sprintf("%s-%d", a.name, profileRuns[a.name])
			enc := base64.StdEncoding.EncodeToString(prof.Bytes())
			for len(enc) > 0 {
				n := min(len(enc), 3000)
				b.Logf("pprof %s %s", name, enc[:n])
				enc = enc[n:]
			}
		})
	}
}

// decodeOnlyHistory is zstd-decode-only with WithDecoderLowmem(false): the
// decoder keeps the window and what it decodes after it in one history
// buffer and moves the last window to its front when the buffer is full.
// The default buffer is the window plus 1 MiB (an 8 MiB window is moved
// after every megabyte decoded), this one twice the window.
var decodeOnlyHistory = struct {
	name string
	fn   applier
}{"zstd-decode-only-2xwindow", func(dir string, r io.Reader) error {
	zr, err := zstd.NewReader(r, zstd.WithDecoderLowmem(false))
	if err != nil {
		return err
	}
	defer zr.Close()
	_, err = io.Copy(io.Discard, zr)
	return err
}}

// profileRuns counts each contender's runs in BenchmarkApplyZstdProfile,
// which name its profiles: every run logs a profile of its own.
var profileRuns = map[string]int{}
