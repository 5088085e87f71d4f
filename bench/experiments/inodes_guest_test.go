//go:build ovlkit_guest

package experiments

import (
	"fmt"
	"testing"
	"time"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// BenchmarkInodes is experiment 4: the inodes a stack of image layers
// takes on ext4 in the store's hardlink layout (every layer a full tree:
// a new inode per directory) and in its overlay layout (every layer only
// its diff). The first layer is the image of experiment 1, each further
// one adds ten files in a new directory and changes one file.
func BenchmarkInodes(b *testing.B) {
	describe(b)
	c := loadConfig(b)
	rec := recorder{b, "inodes"}
	image := imageTar(b, c)
	small := make([][]byte, c.inodeLayers)
	for i := 1; i < c.inodeLayers; i++ {
		dir := fmt.Sprintf("layer%03d", i)
		files := []tarFile{{name: "d0000/changed", size: 512}}
		for j := 0; j < 10; j++ {
			files = append(files, tarFile{name: fmt.Sprintf("%s/f%d", dir, j), size: 1024})
		}
		small[i] = makeTar(b, []string{"d0000", dir}, files, uint64(10+i))
	}
	fs := guesttest.NeedFS(b, "ext4")
	start := time.Now()
	for rep := 0; rep < c.reps; rep++ {
		for _, layout := range []graph.Layout{graph.LayoutOverlay, graph.LayoutHardlink} {
			name := string(layout) + "-ext4"
			// A sub-benchmark per store, so that its scratch directory
			// is removed before the next one starts.
			b.Run(fmt.Sprintf("%s/rep%d", layout, rep), func(b *testing.B) {
				s := openStore(b, fs, layout, graph.SyncNone)
				before, err := InodesUsed(s.Home())
				if err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				parent := ""
				for i := 0; i < c.inodeLayers; i++ {
					id := fmt.Sprintf("l%03d", i)
					tarball := image
					if i > 0 {
						tarball = small[i]
					}
					addImage(b, s, id, parent, tarball)
					parent = id
					used, err := InodesUsed(s.Home())
					if err != nil {
						b.Fatal(err)
					}
					rec.emit(name, float64(i+1), "inodes", "inodes", rep, float64(used-before))
				}
				rec.emit(name, float64(c.inodeLayers), "build_s", "s", rep, time.Since(t0).Seconds())
			})
		}
		b.Logf("inodes repetition %d done after %v", rep, time.Since(start).Round(time.Second))
	}
}
