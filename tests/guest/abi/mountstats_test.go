//go:build ovlkit_guest

package abi

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/procfs"

	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// TestMountstatsProcfs reads /proc/self/mountstats the way node_exporter's
// mountstats collector does while several overlays are mounted. procfs
// fails the whole file when a line other than an NFS one carries anything
// after "with fstype TYPE", so an overlay ->show_stats would take every
// mount's statistics away from the collector, NFS included.
func TestMountstatsProcfs(t *testing.T) {
	guesttest.Keeps(t, "/proc/self/mountstats stays parseable by prometheus/procfs with overlays mounted")
	tmpfs := guesttest.FS{Name: "tmpfs"}

	var mountPoints []string

	// Lower layers only: no upper, nothing to copy up.
	ro := guesttest.NewLayers(t, tmpfs.Scratch(t, ""), 2)
	writeFile(t, filepath.Join(ro.Lower[1], "f"))
	ro.Upper = ""
	ro.Mount(t)
	mountPoints = append(mountPoints, ro.Merged)

	// A tmpfs upper, and disk uppers whose lower is on a tmpfs, each with
	// a copy up done so a kernel that counts has something to print.
	uppers := []struct {
		fs   guesttest.FS
		opts []string
	}{
		{tmpfs, nil},
		{guesttest.NeedFS(t, "ext4"), nil},
		{guesttest.NeedFS(t, "xfs"), []string{"redirect_dir=on", "metacopy=on"}},
	}
	for _, u := range uppers {
		l := guesttest.NewLayers(t, u.fs.Scratch(t, ""), 1)
		l.Lower[0] = filepath.Join(tmpfs.Scratch(t, ""), "lower")
		if err := os.Mkdir(l.Lower[0], 0o755); err != nil {
			t.Fatalf("mkdir %s: %v", l.Lower[0], err)
		}
		writeFile(t, filepath.Join(l.Lower[0], "f"))
		l.Mount(t, u.opts...)
		copyUp(t, l.Merged, "f")
		mountPoints = append(mountPoints, l.Merged)
	}

	mounts := guesttest.ProcfsMountStats(t)

	for _, mp := range mountPoints {
		var found *procfs.Mount
		for _, m := range mounts {
			if m.Mount == mp {
				found = m
			}
		}
		if found == nil {
			t.Errorf("procfs lists no mount on %s (%d mounts parsed)", mp, len(mounts))
			continue
		}
		if found.Type != "overlay" || found.Device != "overlay" {
			t.Errorf("procfs reads the mount on %s as device %q fstype %q, want overlay and overlay", mp, found.Device, found.Type)
		}
		// procfs only fills Stats for a line with fields after the fstype.
		if found.Stats != nil {
			t.Errorf("procfs found statistics on the overlay line of %s: %#v", mp, found.Stats)
		}
	}
}
