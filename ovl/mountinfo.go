package ovl

import (
	"fmt"
	"sort"

	"github.com/moby/sys/mountinfo"
)

// MountsBeneath lists the mount points at or below dir, deepest first, so
// that they can be detached in that order. The paths come unescaped from
// /proc/self/mountinfo (a space is \040 there), so a mount point whose
// name holds one is found too.
func MountsBeneath(dir string) ([]string, error) {
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return nil, fmt.Errorf("mounts beneath %s: %w", dir, err)
	}
	return deepestFirst(infos), nil
}

// deepestFirst returns the mount points of infos, longest path first.
func deepestFirst(infos []*mountinfo.Info) []string {
	out := make([]string, 0, len(infos))
	for _, m := range infos {
		out = append(out, m.Mountpoint)
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}
