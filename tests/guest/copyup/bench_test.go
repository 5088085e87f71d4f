//go:build ovlkit_guest

package copyup

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// benchMode is one configuration the copy-up benchmarks compare.
type benchMode struct {
	name  string
	opts  []string // extra overlay mount options
	trace bool     // overlayfs copy-up events enabled while copying up
}

// benchModes: "off" is what any kernel runs (the stock baseline, and the
// patched kernel with its tracepoints disabled), "trace" enables the
// overlayfs events into a tracefs buffer, "strict" mounts fsync=strict.
// The last two need the patched kernel; select "off" alone on stock with
// -bench 'CopyUp/(ext4|xfs)/off'.
var benchModes = []benchMode{
	{name: "off"},
	{name: "trace", trace: true},
	{name: "strict", opts: []string{"fsync=strict"}},
}

// benchSizes are the file sizes of BenchmarkCopyUpFile. The issue asks for
// up to 256 MiB; under TCG emulation that case alone would take minutes per
// mode, so the largest size is 64 MiB.
var benchSizes = []int{1 << 10, 1 << 20, 16 << 20, 64 << 20}

// benchUppers are the upper filesystems compared, each with its lower
// layer on the other one so that copy up copies data instead of cloning.
var benchUppers = [][2]string{{"ext4", "xfs"}, {"xfs", "ext4"}}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	default:
		return fmt.Sprintf("%dKiB", n>>10)
	}
}

// mountBench mounts an overlay for one benchmark run in mode, with a fresh
// upper and work directory on upper, and returns it.
func mountBench(b *testing.B, upper guesttest.FS, lower string, mode benchMode) guesttest.Layers {
	b.Helper()
	l := guesttest.NewLayers(b, upper.Scratch(b, ""), 1)
	l.Lower[0] = lower
	l.Mount(b, mode.opts...)
	if mode.trace {
		newTrace(b, copyUpEvents...)
	}
	return l
}

// BenchmarkCopyUpFile measures the copy up of one lower file of each size,
// triggered by opening it for writing.
func BenchmarkCopyUpFile(b *testing.B) {
	for _, fsPair := range benchUppers {
		upper, lowerFS := guesttest.NeedFS(b, fsPair[0]), guesttest.NeedFS(b, fsPair[1])
		b.Run(upper.Name, func(b *testing.B) {
			for _, mode := range benchModes {
				b.Run(mode.name, func(b *testing.B) {
					for _, size := range benchSizes {
						b.Run(sizeName(size), func(b *testing.B) {
							benchCopyUpFile(b, upper, lowerFS, mode, size)
						})
					}
				})
			}
		})
	}
}

func benchCopyUpFile(b *testing.B, upper, lowerFS guesttest.FS, mode benchMode, size int) {
	lower := filepath.Join(lowerFS.Scratch(b, ""), "lower")
	guestfs.Mkdir(b, lower, 0o755)
	data := pattern(size)
	for i := 0; i < b.N; i++ {
		if err := os.WriteFile(filepath.Join(lower, fmt.Sprint(i)), data, 0o644); err != nil {
			b.Fatalf("write lower file: %v", err)
		}
	}
	l := mountBench(b, upper, lower, mode)
	// Write back the lower files now, not during the copy ups.
	unix.Sync()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, err := os.OpenFile(filepath.Join(l.Merged, fmt.Sprint(i)), os.O_WRONLY, 0)
		if err != nil {
			b.Fatalf("copy up: %v", err)
		}
		f.Close()
	}
	b.StopTimer()
}

// Tree shape of BenchmarkCopyUpTree: directories of 100 files of 1 KiB.
// One copy up takes milliseconds under TCG, so the default is 20
// directories (2,000 files); -env OVLKIT_COPYUP_TREE_DIRS=100 gives the
// 10,000-file tree of the issue on faster guests.
const (
	treeFiles       = 100
	treeSize        = 1 << 10
	defaultTreeDirs = 20
)

func treeDirs(b *testing.B) int {
	v := os.Getenv("OVLKIT_COPYUP_TREE_DIRS")
	if v == "" {
		return defaultTreeDirs
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("OVLKIT_COPYUP_TREE_DIRS=%q: want a positive number", v)
	}
	return n
}

// BenchmarkCopyUpTree measures "chown -R" of a lower tree: every directory
// and file is copied up, as a container's first recursive chown does.
func BenchmarkCopyUpTree(b *testing.B) {
	for _, fsPair := range benchUppers {
		upper, lowerFS := guesttest.NeedFS(b, fsPair[0]), guesttest.NeedFS(b, fsPair[1])
		b.Run(upper.Name, func(b *testing.B) {
			dirs := treeDirs(b)
			lower := filepath.Join(lowerFS.Scratch(b, ""), "lower")
			makeTree(b, lower, dirs)
			unix.Sync()
			for _, mode := range benchModes {
				b.Run(mode.name, func(b *testing.B) {
					benchCopyUpTree(b, upper, lower, dirs, mode)
				})
			}
		})
	}
}

func makeTree(b *testing.B, root string, dirs int) {
	b.Helper()
	guestfs.Mkdir(b, root, 0o755)
	data := pattern(treeSize)
	for d := 0; d < dirs; d++ {
		dir := filepath.Join(root, fmt.Sprintf("d%03d", d))
		guestfs.Mkdir(b, dir, 0o755)
		for f := 0; f < treeFiles; f++ {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d", f)), data, 0o644); err != nil {
				b.Fatalf("write tree: %v", err)
			}
		}
	}
}

func benchCopyUpTree(b *testing.B, upper guesttest.FS, lower string, dirs int, mode benchMode) {
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		l := mountBench(b, upper, lower, mode)
		b.StartTimer()
		chownTree(b, l.Merged, dirs)
		b.StopTimer()
		l.Unmount(b)
		b.StartTimer()
	}
}

// chownTree changes the owner of every directory and file below root, which
// copies each of them up.
func chownTree(b *testing.B, root string, dirs int) {
	for d := 0; d < dirs; d++ {
		dir := filepath.Join(root, fmt.Sprintf("d%03d", d))
		if err := os.Lchown(dir, 1000, 1000); err != nil {
			b.Fatalf("chown: %v", err)
		}
		for f := 0; f < treeFiles; f++ {
			if err := os.Lchown(filepath.Join(dir, fmt.Sprintf("f%03d", f)), 1000, 1000); err != nil {
				b.Fatalf("chown: %v", err)
			}
		}
	}
}
