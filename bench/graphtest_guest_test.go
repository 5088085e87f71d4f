//go:build ovlkit_guest

package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"

	"github.com/docker/docker/daemon/graphdriver"
	"github.com/docker/docker/daemon/graphdriver/graphtest"
	"github.com/moby/go-archive"
	"github.com/moby/sys/user"
	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/layer"
	"github.com/ovlkit/ovlkit/ovl"
)

// ovlgraphName is the name the store registers under in moby's driver
// registry, so that moby's own graph driver benchmarks (graphtest) run on
// it exactly as they run on overlay2.
const ovlgraphName = "ovlgraph"

func init() {
	if err := graphdriver.Register(ovlgraphName, initGraphDriver); err != nil {
		panic(err)
	}
}

// probed holds the kernel features probed per backing filesystem: the
// probe mounts, and graphtest opens a fresh store for every run of a
// benchmark function, which is setup, not what is measured.
var probed sync.Map // device number -> ovl.Features

// initGraphDriver opens the store in root, which graphdriver.New names
// after the driver under its own root and leaves to the driver to make.
func initGraphDriver(root string, _ []string, _ user.IdentityMapping) (graphdriver.Driver, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil {
		return nil, err
	}
	opts := graph.Options{Create: true, Sync: graph.SyncNone}
	if f, ok := probed.Load(st.Dev); ok {
		feat := f.(ovl.Features)
		opts.Features = &feat
	}
	s, err := graph.Open(root, opts)
	if err != nil {
		return nil, err
	}
	probed.LoadOrStore(st.Dev, s.Features())
	return &graphDriver{s: s}, nil
}

// graphDriver is the store as a graphdriver.Driver. Its sync policy is
// SyncNone because overlay2 never syncs.
type graphDriver struct{ s *graph.Store }

var bg = context.Background()

func (d *graphDriver) String() string { return ovlgraphName }

func (d *graphDriver) CreateReadWrite(id, parent string, _ *graphdriver.CreateOpts) error {
	return d.s.CreateReadWrite(bg, id, parent)
}

func (d *graphDriver) Create(id, parent string, _ *graphdriver.CreateOpts) error {
	return d.s.Create(bg, id, parent)
}

func (d *graphDriver) Remove(id string) error                        { return d.s.Remove(bg, id) }
func (d *graphDriver) Get(id, _ string) (string, error)              { return d.s.Get(bg, id) }
func (d *graphDriver) Put(id string) error                           { return d.s.Put(bg, id) }
func (d *graphDriver) Exists(id string) bool                         { return d.s.Exists(id) }
func (d *graphDriver) Status() [][2]string                           { return [][2]string{{"Layout", string(d.s.Layout())}} }
func (d *graphDriver) GetMetadata(string) (map[string]string, error) { return nil, nil }

func (d *graphDriver) Cleanup() error {
	return errors.Join(d.s.Cleanup(), d.s.Close())
}

// checkParent refuses a parent other than the layer's own: the store
// diffs a layer against its parent only, as overlay2 does on its fast
// path.
func (d *graphDriver) checkParent(id, parent string) error {
	li, err := d.s.Layer(id)
	if err != nil {
		return err
	}
	if parent != "" && parent != li.Parent {
		return fmt.Errorf("%s: diff against %s, not its parent %s: not supported", id, parent, li.Parent)
	}
	return nil
}

// Diff streams the tar through a pipe, as go-archive's TarWithOptions,
// which overlay2 returns, does.
func (d *graphDriver) Diff(id, parent string) (io.ReadCloser, error) {
	if err := d.checkParent(id, parent); err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(d.s.Diff(bg, id, pw)) }()
	return pr, nil
}

func (d *graphDriver) Changes(id, parent string) ([]archive.Change, error) {
	if err := d.checkParent(id, parent); err != nil {
		return nil, err
	}
	ch, err := d.s.Changes(bg, id)
	if err != nil {
		return nil, err
	}
	out := make([]archive.Change, len(ch))
	for i, c := range ch {
		out[i].Path = c.Path
		switch c.Kind {
		case layer.ChangeAdd:
			out[i].Kind = archive.ChangeAdd
		case layer.ChangeDelete:
			out[i].Kind = archive.ChangeDelete
		default:
			out[i].Kind = archive.ChangeModify
		}
	}
	return out, nil
}

func (d *graphDriver) ApplyDiff(id, parent string, r io.Reader) (int64, error) {
	if err := d.checkParent(id, parent); err != nil {
		return 0, err
	}
	return d.s.ApplyDiff(bg, id, r)
}

func (d *graphDriver) DiffSize(id, parent string) (int64, error) {
	if err := d.checkParent(id, parent); err != nil {
		return 0, err
	}
	return d.s.DiffSize(id)
}

// graphtestDrivers are the contenders of BenchmarkGraphtest.
var graphtestDrivers = []string{ovlgraphName, "overlay2"}

// BenchmarkGraphtest runs benchmarks of moby's graphtest package
// (daemon/graphdriver/graphtest, the ones moby runs on its own drivers)
// on the store and on overlay2, in the same boot, as moby runs them: one
// sub-benchmark per driver, BenchmarkGraphtest/<fs>/<case>/<driver>,
// sized by -benchtime (leave OVLKIT_BENCHTIME unset: 1 s; with 1x a case
// is one operation). The cases:
//
//   - GetEmpty: Get of a layer without a parent (Put is not timed);
//   - DiffBase: Diff of a base layer of three small files, read to the
//     end.
//
// testing.Benchmark, which would let the drivers take turns within one
// benchmark, cannot run inside one (both take the benchmark lock), so the
// turns are -count's; compare the drivers' medians.
func BenchmarkGraphtest(b *testing.B) {
	cases := []struct {
		name string
		fn   func(*testing.B, string, ...string)
	}{
		{"GetEmpty", graphtest.DriverBenchGetEmpty},
		{"DiffBase", graphtest.DriverBenchDiffBase},
	}
	for _, fs := range benchFilesystems(b) {
		b.Run(fs.Name, func(b *testing.B) {
			// graphtest makes every driver's root with os.MkdirTemp.
			b.Setenv("TMPDIR", fs.Scratch(b, ""))
			for _, c := range cases {
				b.Run(c.name, func(b *testing.B) {
					for _, name := range graphtestDrivers {
						b.Run(name, func(b *testing.B) { c.fn(b, name) })
					}
				})
			}
		})
	}
}

// TestGraphtestSmoke runs moby's graphtest checks of empty and base
// layers and of a diff applied elsewhere on both drivers, so that what
// BenchmarkGraphtest measures is known to work through the adapter (and
// a failure shows its message, which testing.Benchmark drops).
func TestGraphtestSmoke(t *testing.T) {
	fs := benchFilesystems(t)[0]
	t.Setenv("TMPDIR", fs.Scratch(t, ""))
	for _, name := range graphtestDrivers {
		t.Run(name, func(t *testing.T) {
			graphtest.DriverTestCreateEmpty(t, name)
			graphtest.DriverTestCreateBase(t, name)
			graphtest.DriverTestDiffApply(t, 10, name)
		})
	}
}
