package ovl

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// MountStats is one entry of /proc/self/mountstats. Filesystems with a
// show_stats operation append their statistics after the fstype; the
// ovlkit series reports overlay copy-up counters there as key=value pairs.
type MountStats struct {
	Device     string
	MountPoint string
	FSType     string
	// Raw is the text after the fstype, including continuation lines.
	Raw string
	// Counters holds every key=value (or "key: value") pair of Raw whose
	// value is an unsigned integer, except the format version.
	Counters map[string]uint64
	// StatVers is the statvers= value, the version of the format.
	StatVers string
}

// HasStats reports whether the filesystem printed statistics at all.
func (m MountStats) HasStats() bool { return strings.TrimSpace(m.Raw) != "" }

// ParseMountStats reads the mountstats format: one "device D mounted on M
// with fstype T[ stats]" line per mount, optionally followed by indented
// continuation lines (NFS style).
func ParseMountStats(r io.Reader) ([]MountStats, error) {
	var out []MountStats
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "device ") {
			m, err := parseDeviceLine(line)
			if err != nil {
				return nil, err
			}
			out = append(out, m)
			continue
		}
		if len(out) > 0 && strings.TrimSpace(line) != "" {
			last := &out[len(out)-1]
			last.Raw += "\n" + line
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountstats: %w", err)
	}
	for i := range out {
		out[i].Counters = parseCounters(out[i].Raw)
		out[i].StatVers = statVers(out[i].Raw)
		delete(out[i].Counters, "statvers")
	}
	return out, nil
}

func parseDeviceLine(line string) (MountStats, error) {
	rest := strings.TrimPrefix(line, "device ")
	dev, rest, ok := strings.Cut(rest, " mounted on ")
	if !ok {
		return MountStats{}, fmt.Errorf("mountstats line without mount point: %q", line)
	}
	mp, rest, ok := strings.Cut(rest, " with fstype ")
	if !ok {
		return MountStats{}, fmt.Errorf("mountstats line without fstype: %q", line)
	}
	fstype, raw, _ := strings.Cut(rest, " ")
	return MountStats{
		Device:     unmangle(dev),
		MountPoint: unmangle(mp),
		FSType:     fstype,
		Raw:        raw,
	}, nil
}

// parseCounters accepts both key=value and "key: value" pairs so that the
// reader does not depend on the punctuation of one kernel version.
func parseCounters(raw string) map[string]uint64 {
	c := map[string]uint64{}
	fields := strings.Fields(raw)
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		if k, v, ok := strings.Cut(f, "="); ok && k != "" {
			if n, err := strconv.ParseUint(strings.TrimRight(v, ",;"), 10, 64); err == nil {
				c[k] = n
			}
			continue
		}
		if strings.HasSuffix(f, ":") && i+1 < len(fields) {
			if n, err := strconv.ParseUint(strings.TrimRight(fields[i+1], ",;"), 10, 64); err == nil {
				c[strings.TrimSuffix(f, ":")] = n
				i++
			}
		}
	}
	return c
}

func statVers(raw string) string {
	for _, f := range strings.Fields(raw) {
		if v, ok := strings.CutPrefix(f, "statvers="); ok {
			return v
		}
	}
	return ""
}

// unmangle reverses the octal escapes the kernel uses for space, tab,
// newline and backslash in paths.
func unmangle(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// MountStatsFor returns the entry for the mount at mountPoint from
// /proc/self/mountstats; the last one wins when mounts are stacked.
func MountStatsFor(mountPoint string) (MountStats, bool, error) {
	f, err := os.Open("/proc/self/mountstats")
	if err != nil {
		return MountStats{}, false, fmt.Errorf("open mountstats: %w", err)
	}
	defer f.Close()
	all, err := ParseMountStats(f)
	if err != nil {
		return MountStats{}, false, err
	}
	var found MountStats
	ok := false
	for _, m := range all {
		if m.MountPoint == mountPoint {
			found, ok = m, true
		}
	}
	return found, ok, nil
}
