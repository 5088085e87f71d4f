package ovl

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
)

// sysfsOverlay is where the ovlkit series puts one directory per overlay
// mount, named after the overlay's device number (major:minor).
const sysfsOverlay = "/sys/fs/overlay"

// ErrNotOverlay is returned by CopyUpStats for a path that is not the mount
// point of an overlay.
var ErrNotOverlay = errors.New("no overlay is mounted there")

// CopyUpStats returns the copy-up counters the ovlkit series keeps for the
// overlay mounted at mountPoint, keyed by counter name (reg, dir,
// copied_bytes, ...). On a kernel without the series the overlay has no
// counter directory and the error wraps fs.ErrNotExist.
func CopyUpStats(mountPoint string) (map[string]uint64, error) {
	// mount(2) resolves the target, so mountinfo holds the resolved path.
	mp, err := filepath.EvalSymlinks(mountPoint)
	if err != nil {
		return nil, fmt.Errorf("copy-up statistics of %s: %w", mountPoint, err)
	}
	infos, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return m.Mountpoint != mp, false
	})
	if err != nil {
		return nil, fmt.Errorf("copy-up statistics of %s: %w", mountPoint, err)
	}
	dir, err := copyUpDir(infos, mp)
	if err != nil {
		return nil, fmt.Errorf("copy-up statistics of %s: %w", mountPoint, err)
	}
	return ReadCopyUpStats(dir)
}

// copyUpDir names the counter directory of the mount that is visible at
// mountPoint: the last of the entries mounted there, which must be an
// overlay. The device number in mountinfo is the overlay's st_dev, which
// names the directory.
func copyUpDir(infos []*mountinfo.Info, mountPoint string) (string, error) {
	var top *mountinfo.Info
	for _, m := range infos {
		if m.Mountpoint == mountPoint {
			top = m
		}
	}
	if top == nil {
		return "", fmt.Errorf("%s is not a mount point: %w", mountPoint, ErrNotOverlay)
	}
	if top.FSType != "overlay" {
		return "", fmt.Errorf("%s is a %s mount: %w", mountPoint, top.FSType, ErrNotOverlay)
	}
	return filepath.Join(sysfsOverlay, fmt.Sprintf("%d:%d", top.Major, top.Minor), "copy_up"), nil
}

// ReadCopyUpStats reads a counter directory: every file holds one decimal
// value, and its name is the counter's name. Counters a later kernel adds
// are returned too.
func ReadCopyUpStats(dir string) (map[string]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read copy-up counters: %w", err)
	}
	out := make(map[string]uint64, len(ents))
	for _, e := range ents {
		// A subdirectory would be a group of other attributes, not a
		// counter.
		if e.IsDir() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read copy-up counter: %w", err)
		}
		// sysfs attributes end their value with a newline.
		v, err := strconv.ParseUint(strings.TrimSuffix(string(b), "\n"), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("copy-up counter %s: %w", p, err)
		}
		out[e.Name()] = v
	}
	return out, nil
}
