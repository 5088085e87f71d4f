//go:build ovlkit_guest

// Package abi reads what the series changes in /proc with the parsers real
// programs use, while overlays are mounted: github.com/prometheus/procfs for
// /proc/self/mountstats (node_exporter's mountstats collector) and
// github.com/moby/sys/mountinfo for /proc/self/mountinfo (containerd,
// Docker, runc). A kernel change that such a reader cannot parse breaks
// those programs on every host that mounts an overlay, whatever the
// overlay itself does.
//
// util-linux's findmnt, the other common reader, is not in the guest (the
// initramfs holds u-root's init and the test binaries only), so it is not
// exercised here; no test carries a parser of its own instead.
package abi

import (
	"os"
	"path/filepath"
	"testing"
)

// Subjects of the patches that add the mount options these tests show,
// exactly as in patches/6.1 and patches/6.12. fsync= is a patch of the 6.1
// series only: 6.12 has it upstream, and the harness judges a proof of it
// there as a keeps test.
const (
	subjectStrictUpper  = "ovl: add strict_upper option to fail instead of degrading"
	subjectStrictOpaque = "ovl: validate the opaque xattr value"
	subjectFsync        = "ovl: add fsync=auto|strict|volatile mount option"
)

// lastOptionSubject is, per kernel base, the patch of the series that adds
// the last of the mount options the series adds: a mount with all of them
// needs that patch last.
var lastOptionSubject = map[string]string{
	"6.1":  subjectFsync,
	"6.12": subjectStrictOpaque,
}

// shownByDefault is, per kernel base, what the super options of a new
// overlay with an upper layer show without being asked. 6.12 (since 6.6)
// shows uuid=on: the default uuid=auto becomes uuid=on on the first mount
// of an upper dir that has no overlay.uuid xattr and is not impure, and
// the persistent uuid is then stored on the upper root.
var shownByDefault = map[string][]string{
	"6.1":  nil,
	"6.12": {"uuid=on"},
}

// writeFile makes a lower file for a test to copy up.
func writeFile(t testing.TB, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("lower data\n"), 0o644); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}

// copyUp copies name up by opening it for writing through the overlay, so
// the mount has done what its statistics would count.
func copyUp(t testing.TB, merged, name string) {
	t.Helper()
	p := filepath.Join(merged, name)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("open %s for write: %v", p, err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close %s: %v", p, err)
	}
}
