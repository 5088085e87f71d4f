package layer

import (
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReadXattrs: keep picks the names, nil keeps all, and a value longer
// than the first buffer comes back whole.
func TestReadXattrs(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	writeFile(t, p, "x", 0o644)
	long := strings.Repeat("v", 1000)
	setXattr(t, p, "trusted.overlay.opaque", "y")
	setXattr(t, p, "trusted.ovlkit-test", long)

	all, err := ReadXattrs(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || string(all["trusted.overlay.opaque"]) != "y" || string(all["trusted.ovlkit-test"]) != long {
		t.Errorf("ReadXattrs(nil) = %q", all)
	}
	public, err := listXattrs(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(public) != 1 || string(public["trusted.ovlkit-test"]) != long {
		t.Errorf("listXattrs kept %q, want only trusted.ovlkit-test", public)
	}
	if err := unix.Lremovexattr(p, "trusted.ovlkit-test"); err != nil {
		t.Fatal(err)
	}
	if none, err := listXattrs(p); err != nil || none != nil {
		t.Errorf("listXattrs with only overlay xattrs = %q, %v; want nil", none, err)
	}
}
