package graph

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// fsNames names filesystems by their statfs magic.
var fsNames = map[int64]string{
	0xEF53:     "ext4",
	0x58465342: "xfs",
	0x9123683E: "btrfs",
	0x01021994: "tmpfs",
	0x794c7630: "overlay",
	0x858458f6: "ramfs",
	0x6969:     "nfs",
	0x4d44:     "vfat",
	0x2011bab0: "exfat",
	0x65735546: "fuse",
	0xf15f:     "ecryptfs",
	0x2fc12fc1: "zfs",
	0xf2f52010: "f2fs",
}

// BackingFS names the filesystem of dir.
func BackingFS(dir string) (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "", fmt.Errorf("statfs %s: %w", dir, err)
	}
	if n, ok := fsNames[int64(st.Type)]; ok {
		return n, nil
	}
	return fmt.Sprintf("0x%x", st.Type), nil
}

// unfitFS are filesystems overlayfs cannot use as an upper layer, by the
// name BackingFS gives them, with the reason. Other filesystems are
// judged by the feature probe.
var unfitFS = map[string]string{
	"vfat":     "FAT has no whiteouts (character devices), xattrs or symlinks",
	"exfat":    "exFAT has no whiteouts (character devices), xattrs or symlinks",
	"overlay":  "overlayfs does not take an overlay as its upper layer",
	"nfs":      "overlayfs does not take a network filesystem as its upper layer",
	"fuse":     "overlayfs does not take a FUSE filesystem as its upper layer",
	"ecryptfs": "overlayfs does not take eCryptfs as its upper layer",
}

// checkBackingFS refuses a new store on a filesystem in unfitFS, before
// anything is created; home may not exist yet, so its nearest existing
// ancestor is asked.
func checkBackingFS(home string) error {
	dir := home
	for {
		name, err := BackingFS(dir)
		if errors.Is(err, unix.ENOENT) && dir != filepath.Dir(dir) {
			dir = filepath.Dir(dir)
			continue
		}
		if err != nil {
			return fmt.Errorf("store home %s: %w", home, err)
		}
		if why, ok := unfitFS[name]; ok {
			return fmt.Errorf("store home %s is on %s: %s: %w", home, name, why, ErrUnfitFS)
		}
		return nil
	}
}
