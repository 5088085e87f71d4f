//go:build ovlkit_guest

package graphsuite

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// Group 10: a store is refused on a filesystem overlayfs cannot use as an
// upper layer, with an error that names the reason, and the refused
// Open leaves nothing behind. xfs without ftype is caught by the feature
// probe (readdir reports no d_type); FAT and an overlay by the backing
// filesystem's type, before anything is created: 6.1 mounts an overlay on
// FAT with no more than a warning, and the store would fail only at its
// first whiteout.
func TestRefusesUnfitBackingFS(t *testing.T) {
	for _, c := range []struct {
		name string
		dir  func(t *testing.T) string
		want string
	}{
		{"xfs-ftype0", func(t *testing.T) string { return guesttest.UnfitDisk(t, "xfs-ftype0") }, "d_type"},
		{"vfat", func(t *testing.T) string { return guesttest.UnfitDisk(t, "vfat") }, "FAT has no whiteouts"},
		{"overlay", overlayScratch, "does not take an overlay as its upper layer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := c.dir(t)
			for _, home := range []string{filepath.Join(dir, "store"), dir} {
				_, err := graph.Open(home, graph.Options{Create: true})
				if !errors.Is(err, graph.ErrUnfitFS) || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("open on %s: %v, want ErrUnfitFS saying %q", c.name, err, c.want)
				}
			}
			ents, err := os.ReadDir(dir)
			must(t, err)
			var left []string
			for _, e := range ents {
				if e.Name() != "lost+found" {
					left = append(left, e.Name())
				}
			}
			if len(left) > 0 {
				t.Errorf("refused Open left %v behind", left)
			}
		})
	}
}

// overlayScratch mounts an overlay on a tmpfs scratch directory and
// returns its merged directory, empty.
func overlayScratch(t *testing.T) string {
	base := guesttest.Filesystems()[0].Scratch(t, "")
	for _, d := range []string{"lower", "upper", "work", "merged"} {
		must(t, os.Mkdir(filepath.Join(base, d), 0o755))
	}
	merged := filepath.Join(base, "merged")
	data := "lowerdir=" + filepath.Join(base, "lower") + ",upperdir=" + filepath.Join(base, "upper") +
		",workdir=" + filepath.Join(base, "work")
	must(t, unix.Mount("overlay", merged, "overlay", 0, data))
	return merged
}
