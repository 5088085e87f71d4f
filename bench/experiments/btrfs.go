package experiments

import (
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The btrfs ioctls that Docker's btrfs driver uses, which
// golang.org/x/sys/unix does not define; from include/uapi/linux/btrfs.h.
const (
	btrfsIoctlMagic    = 0x94
	btrfsPathNameMax   = 4087
	btrfsSubvolNameMax = 4039
)

// btrfsVolArgs is struct btrfs_ioctl_vol_args (4096 bytes).
type btrfsVolArgs struct {
	Fd   int64
	Name [btrfsPathNameMax + 1]byte
}

// btrfsVolArgsV2 is struct btrfs_ioctl_vol_args_v2 (4096 bytes): the
// first union (size and qgroup_inherit pointer, or unused[4]) is kept
// as four zero words, the second (name, devid or subvolid) as the name.
type btrfsVolArgsV2 struct {
	Fd      int64
	Transid uint64
	Flags   uint64
	Unused  [4]uint64
	Name    [btrfsSubvolNameMax + 1]byte
}

// iow is the kernel's _IOW(type, nr, size).
func iow(typ, nr, size uintptr) uintptr {
	const (
		nrBits   = 8
		typeBits = 8
		sizeBits = 14
		write    = 1
	)
	return write<<(nrBits+typeBits+sizeBits) | size<<(nrBits+typeBits) | typ<<nrBits | nr
}

var (
	btrfsIocSnapDestroy  = iow(btrfsIoctlMagic, 15, unsafe.Sizeof(btrfsVolArgs{}))
	btrfsIocSubvolCreate = iow(btrfsIoctlMagic, 14, unsafe.Sizeof(btrfsVolArgs{}))
	btrfsIocSnapCreateV2 = iow(btrfsIoctlMagic, 23, unsafe.Sizeof(btrfsVolArgsV2{}))
)

func btrfsName(dst []byte, name string) error {
	if name == "" || len(name) >= len(dst) || name == "." || name == ".." || filepath.Base(name) != name {
		return fmt.Errorf("btrfs subvolume name %q: want one path component shorter than %d bytes", name, len(dst))
	}
	copy(dst, name)
	return nil
}

func btrfsIoctl(dir string, req uintptr, arg unsafe.Pointer) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

// BtrfsSubvolCreate creates the empty subvolume parent/name.
func BtrfsSubvolCreate(parent, name string) error {
	var a btrfsVolArgs
	if err := btrfsName(a.Name[:], name); err != nil {
		return err
	}
	if err := btrfsIoctl(parent, btrfsIocSubvolCreate, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("create btrfs subvolume %s: %w", filepath.Join(parent, name), err)
	}
	return nil
}

// BtrfsSnapshot creates parent/name as a writable snapshot of the
// subvolume src.
func BtrfsSnapshot(src, parent, name string) error {
	var a btrfsVolArgsV2
	if err := btrfsName(a.Name[:], name); err != nil {
		return err
	}
	s, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", src, err)
	}
	defer s.Close()
	a.Fd = int64(s.Fd())
	if err := btrfsIoctl(parent, btrfsIocSnapCreateV2, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("snapshot %s as %s: %w", src, filepath.Join(parent, name), err)
	}
	return nil
}

// BtrfsSubvolDelete deletes the subvolume or snapshot parent/name. The
// space is given back later by the filesystem's cleaner thread.
func BtrfsSubvolDelete(parent, name string) error {
	var a btrfsVolArgs
	if err := btrfsName(a.Name[:], name); err != nil {
		return err
	}
	if err := btrfsIoctl(parent, btrfsIocSnapDestroy, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("delete btrfs subvolume %s: %w", filepath.Join(parent, name), err)
	}
	return nil
}
