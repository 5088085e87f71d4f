package experiments

import (
	"errors"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The structs must have the kernel's layout, or the ioctl numbers (which
// encode their size) name other commands and the kernel reads the name
// from the wrong offset.
func TestBtrfsStructLayout(t *testing.T) {
	if got := unsafe.Sizeof(btrfsVolArgs{}); got != 4096 {
		t.Errorf("sizeof(btrfs_ioctl_vol_args) = %d, want 4096", got)
	}
	if got := unsafe.Sizeof(btrfsVolArgsV2{}); got != 4096 {
		t.Errorf("sizeof(btrfs_ioctl_vol_args_v2) = %d, want 4096", got)
	}
	if got := unsafe.Offsetof(btrfsVolArgs{}.Name); got != 8 {
		t.Errorf("offsetof(vol_args.name) = %d, want 8", got)
	}
	if got := unsafe.Offsetof(btrfsVolArgsV2{}.Name); got != 56 {
		t.Errorf("offsetof(vol_args_v2.name) = %d, want 56", got)
	}
}

// The numbers as btrfs-progs and strace print them.
func TestBtrfsIoctlNumbers(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"BTRFS_IOC_SNAP_DESTROY", btrfsIocSnapDestroy, 0x5000940f},
		{"BTRFS_IOC_SUBVOL_CREATE", btrfsIocSubvolCreate, 0x5000940e},
		{"BTRFS_IOC_SNAP_CREATE_V2", btrfsIocSnapCreateV2, 0x50009417},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}

func TestBtrfsNameRefused(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"", ".", "..", "a/b", strings.Repeat("x", btrfsPathNameMax+1)} {
		if err := BtrfsSubvolCreate(dir, name); err == nil || !strings.Contains(err.Error(), "path component") {
			t.Errorf("BtrfsSubvolCreate(%q) = %v, want a refused name", name, err)
		}
	}
	if err := BtrfsSnapshot(dir, dir, strings.Repeat("y", btrfsSubvolNameMax+1)); err == nil {
		t.Errorf("BtrfsSnapshot accepted a name longer than BTRFS_SUBVOL_NAME_MAX")
	}
}

// On a filesystem that is not btrfs (procfs here) the ioctl fails with
// the kernel's error, wrapped with the path.
func TestBtrfsIoctlNotBtrfs(t *testing.T) {
	err := BtrfsSubvolCreate("/proc", "sub")
	var errno unix.Errno
	if !errors.As(err, &errno) || !strings.Contains(err.Error(), "/proc/sub") {
		t.Fatalf("BtrfsSubvolCreate on /proc = %v, want an errno naming the path", err)
	}
	err = BtrfsSubvolDelete(t.TempDir(), "missing")
	if !errors.As(err, &errno) {
		t.Fatalf("BtrfsSubvolDelete of a missing subvolume = %v, want an errno", err)
	}
}
