package vm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/ovlkit/ovlkit/vm/guestproto"
)

// diskSize is large enough for every mkfs's minimum (xfs wants 300 MiB) and
// for the tests; the images are sparse, so unused space costs nothing.
const diskSize = 1 << 30

var mkfs = map[string][]string{
	"ext4":  {"mkfs.ext4", "-q", "-F"},
	"xfs":   {"mkfs.xfs", "-q", "-f"},
	"btrfs": {"mkfs.btrfs", "-q", "-f"},
	// ftype=0 needs the old (v4) format, which the guest kernel keeps.
	"xfs-ftype0": {"mkfs.xfs", "-q", "-f", "-m", "crc=0", "-n", "ftype=0"},
	"vfat":       {"mkfs.vfat"},
}

func unfit(fs string) bool {
	for _, u := range guestproto.UnfitFilesystems {
		if fs == u {
			return true
		}
	}
	return false
}

// makeDisk creates a sparse image in dir formatted with fs.
func makeDisk(ctx context.Context, dir, fs string) (string, error) {
	cmdline, ok := mkfs[fs]
	if !ok {
		return "", fmt.Errorf("no disk filesystem %q (have ext4, xfs, btrfs, xfs-ftype0, vfat)", fs)
	}
	img := filepath.Join(dir, fs+".img")
	f, err := os.Create(img)
	if err != nil {
		return "", err
	}
	if err := f.Truncate(diskSize); err != nil {
		f.Close()
		return "", err
	}
	f.Close()
	cmd := exec.CommandContext(ctx, cmdline[0], append(cmdline[1:], img)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%s %s: %v: %s (is %s installed?)", cmdline[0], img, err, out, cmdline[0])
	}
	return img, nil
}

// diskArgs attaches img as a virtio disk whose serial names its filesystem;
// the guest maps disks by serial (tests/guest/guesttest), not probe order.
func diskArgs(i int, fs, img string) []string {
	id := fmt.Sprintf("disk%d", i)
	prefix := guestproto.DiskSerialPrefix
	if unfit(fs) {
		prefix = guestproto.UnfitDiskSerialPrefix
	}
	return []string{
		"-drive", fmt.Sprintf("file=%s,if=none,id=%s,format=raw,cache=unsafe", img, id),
		"-device", fmt.Sprintf("virtio-blk-pci,drive=%s,serial=%s%s", id, prefix, fs),
	}
}
