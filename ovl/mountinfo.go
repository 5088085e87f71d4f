package ovl

import (
	"fmt"
	"sort"
	"strings"

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

// UnescapeMountField decodes one field of /proc/*/mounts or mountinfo as
// the kernel escaped it: a backslash and three octal digits stand for a
// byte. Paths have their space, tab, newline and backslash escaped so
// (mangle_path), and an option value, such as a lowerdir= list, also its
// comma and equals sign (seq_show_option). Anything else is kept as it
// is, so an unescaped field comes back unchanged.
func UnescapeMountField(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) && s[i+1] <= '3' {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return '0' <= c && c <= '7' }
