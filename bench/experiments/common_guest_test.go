//go:build ovlkit_guest

package experiments

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/bench"
	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/layer"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// config holds the sizes of the experiments. The defaults are what make
// bench runs (scaled to fit 1 GiB disks and a run under TCG; see
// Documentation/benchmarks.rst); OVLKIT_EXP_QUICK=1 shrinks everything
// for a check of the code, OVLKIT_EXP_REPS overrides the repetitions.
type config struct {
	reps int
	// 1: create/destroy
	imageFiles int
	imageMiB   int
	ns         []int
	copyMaxN   int
	// 2: page cache
	pcFileMiB   int
	pcTreeFiles int
	pcNs        []int
	// 3: copy-up
	cuSizes     []int64
	cuTreeFiles int
	// 4: inodes
	inodeLayers int
}

func loadConfig(tb testing.TB) config {
	c := config{
		reps:       5,
		imageFiles: 2000, imageMiB: 16,
		ns: []int{1, 10, 50, 200}, copyMaxN: 10,
		pcFileMiB: 16, pcTreeFiles: 500, pcNs: []int{1, 2, 5, 10, 20},
		cuSizes:     []int64{4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20},
		cuTreeFiles: 2000,
		inodeLayers: 50,
	}
	if os.Getenv("OVLKIT_EXP_QUICK") == "1" {
		c = config{
			reps:       2,
			imageFiles: 200, imageMiB: 2,
			ns: []int{1, 5}, copyMaxN: 5,
			pcFileMiB: 4, pcTreeFiles: 50, pcNs: []int{1, 2},
			cuSizes:     []int64{4 << 10, 1 << 20},
			cuTreeFiles: 100,
			inodeLayers: 5,
		}
	}
	if v := os.Getenv("OVLKIT_EXP_REPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			tb.Fatalf("OVLKIT_EXP_REPS=%q: want a positive count", v)
		}
		c.reps = n
	}
	return c
}

// recorder prints records for one experiment.
type recorder struct {
	tb  testing.TB
	exp string
}

func (r recorder) emit(cs string, x float64, metric, unit string, rep int, v float64) {
	r.tb.Helper()
	if err := Emit(os.Stdout, Record{Exp: r.exp, Case: cs, X: x, Metric: metric, Unit: unit, Rep: rep, Value: v}); err != nil {
		r.tb.Fatal(err)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

var envOnce sync.Once

// describe prints the guest's description once per test binary.
func describe(tb testing.TB) {
	envOnce.Do(func() {
		e := Env{"goarch": runtime.GOARCH, "cpus": strconv.Itoa(runtime.NumCPU())}
		var u unix.Utsname
		if unix.Uname(&u) == nil {
			e["kernel"] = unix.ByteSliceToString(u.Release[:])
			e["kernel_version"] = unix.ByteSliceToString(u.Version[:])
		}
		if b, err := os.ReadFile("/proc/meminfo"); err == nil {
			if m, err := Meminfo(b); err == nil {
				e["mem_total_mib"] = strconv.FormatInt(m["MemTotal"]>>20, 10)
			}
		}
		if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
					e["cpu"] = strings.TrimSpace(v)
					break
				}
			}
		}
		if b, err := os.ReadFile("/sys/devices/system/clocksource/clocksource0/current_clocksource"); err == nil {
			e["clocksource"] = strings.TrimSpace(string(b))
		}
		for _, fs := range guesttest.Filesystems() {
			if fs.Device == "" {
				continue
			}
			if b, err := os.ReadFile("/sys/block/" + filepath.Base(fs.Device) + "/size"); err == nil {
				if sectors, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
					e["disk_"+fs.Name+"_mib"] = strconv.FormatInt(sectors*512>>20, 10)
				}
			}
		}
		if err := EmitEnv(os.Stdout, e); err != nil {
			tb.Fatal(err)
		}
	})
}

// dropCaches writes back and drops the page cache, dentries and inodes.
func dropCaches(tb testing.TB) {
	tb.Helper()
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		tb.Fatalf("drop caches: %v", err)
	}
}

// imageTar generates the image layer of experiments 1 and 4.
func imageTar(tb testing.TB, c config) []byte {
	tb.Helper()
	var buf bytes.Buffer
	if _, err := bench.GenerateLayer(&buf, bench.LayerSpec{Files: c.imageFiles, Bytes: int64(c.imageMiB) << 20, Seed: 1}); err != nil {
		tb.Fatalf("generate image layer: %v", err)
	}
	return buf.Bytes()
}

// tarFile is one regular file of a generated tar.
type tarFile struct {
	name string
	size int64
}

// makeTar writes a tar of directories and files with incompressible
// content (parents before children, as the names are given).
func makeTar(tb testing.TB, dirs []string, files []tarFile, seed uint64) []byte {
	tb.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(1700000000, 0)
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime}); err != nil {
			tb.Fatal(err)
		}
	}
	x := Xorshift(seed | 1)
	chunk := make([]byte, 1<<20)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: f.size, ModTime: mtime}); err != nil {
			tb.Fatal(err)
		}
		for left := f.size; left > 0; {
			n := min(left, int64(len(chunk)))
			x.Fill(chunk[:n])
			if _, err := tw.Write(chunk[:n]); err != nil {
				tb.Fatal(err)
			}
			left -= n
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// treeSpec names n files of size bytes in directories of 100.
func treeSpec(prefix string, n int, size int64) ([]string, []tarFile) {
	var dirs []string
	var files []tarFile
	if prefix != "" {
		dirs = append(dirs, prefix)
	}
	for i := 0; i < n; i++ {
		d := filepath.Join(prefix, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			dirs = append(dirs, d)
		}
		files = append(files, tarFile{name: filepath.Join(d, fmt.Sprintf("f%03d", i%100)), size: size})
	}
	return dirs, files
}

// openStore makes a new store in a scratch directory of fs.
func openStore(tb testing.TB, fs guesttest.FS, layout graph.Layout, sync graph.SyncPolicy) *graph.Store {
	tb.Helper()
	home := filepath.Join(fs.Scratch(tb, ""), "store")
	s, err := graph.Open(home, graph.Options{Layout: layout, Create: true, Sync: sync})
	if err != nil {
		tb.Fatalf("open %s store on %s: %v", layout, fs.Name, err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("close store: %v", err)
		}
	})
	return s
}

// addImage creates image layer id on parent and applies tarball to it.
func addImage(tb testing.TB, s *graph.Store, id, parent string, tarball []byte) {
	tb.Helper()
	ctx := context.Background()
	if err := s.Create(ctx, id, parent); err != nil {
		tb.Fatalf("create image %s: %v", id, err)
	}
	if _, err := s.ApplyDiff(ctx, id, bytes.NewReader(tarball)); err != nil {
		tb.Fatalf("apply image %s: %v", id, err)
	}
}

// btrfsImage makes subvolume dir/name holding tarball's tree.
func btrfsImage(tb testing.TB, dir, name string, tarball []byte) string {
	tb.Helper()
	if err := BtrfsSubvolCreate(dir, name); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := BtrfsSubvolDelete(dir, name); err != nil {
			tb.Errorf("%v", err)
		}
	})
	p := filepath.Join(dir, name)
	applyTo(tb, p, tarball)
	return p
}

// applyTo unpacks tarball into the existing directory dir.
func applyTo(tb testing.TB, dir string, tarball []byte) {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	if _, err := layerApply(dir, bytes.NewReader(tarball)); err != nil {
		tb.Fatalf("unpack into %s: %v", dir, err)
	}
}

// mountOverlay mounts an overlay of lower, upper and work on merged.
func mountOverlay(tb testing.TB, lower, upper, work, merged, extra string) {
	tb.Helper()
	for _, d := range []string{upper, work, merged} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	data := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if extra != "" {
		data += "," + extra
	}
	if err := unix.Mount("overlay", merged, "overlay", 0, data); err != nil {
		tb.Fatalf("mount overlay %s: %v", data, err)
	}
}

func unmount(tb testing.TB, dir string) {
	tb.Helper()
	if err := unix.Unmount(dir, 0); err != nil {
		tb.Fatalf("unmount %s: %v", dir, err)
	}
}

// layerApply unpacks a tar into dir as the store does (overlay whiteouts).
func layerApply(dir string, r io.Reader) (int64, error) {
	return layer.Apply(context.Background(), dir, r, layer.ApplyOptions{})
}
