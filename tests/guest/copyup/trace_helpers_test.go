//go:build ovlkit_guest

package copyup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

const tracefsRoot = "/sys/kernel/tracing"

// traceInstance is a tracefs instance: a ring buffer and a set of enabled
// events of its own, so one test's events never mix with another's and the
// global buffer stays untouched.
type traceInstance struct {
	dir string
}

// newTrace creates a tracefs instance with the given events ("system/name")
// enabled. A missing event fails the test: the kernel under test does not
// have it.
func newTrace(t testing.TB, events ...string) *traceInstance {
	t.Helper()
	ensureTracefs(t)
	base := "ovlkit-" + regexp.MustCompile(`[^A-Za-z0-9_-]+`).ReplaceAllString(t.Name(), "_")
	var dir string
	// A test may hold several instances at once: number them.
	for i := 0; ; i++ {
		dir = filepath.Join(tracefsRoot, "instances", fmt.Sprintf("%s-%d", base, i))
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrExist) {
			t.Fatalf("create trace instance: %v", err)
		}
	}
	ti := &traceInstance{dir: dir}
	t.Cleanup(func() {
		for _, ev := range events {
			// Best effort: rmdir fails while events are enabled.
			_ = os.WriteFile(ti.eventFile(ev, "enable"), []byte("0"), 0)
		}
		if err := unix.Rmdir(dir); err != nil {
			t.Errorf("remove trace instance %s: %v", dir, err)
		}
	})
	for _, ev := range events {
		if err := os.WriteFile(ti.eventFile(ev, "enable"), []byte("1"), 0); err != nil {
			t.Fatalf("enable trace event %s: %v", ev, err)
		}
	}
	return ti
}

// ensureTracefs mounts tracefs when the guest has not.
func ensureTracefs(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(tracefsRoot, "instances")); err == nil {
		return
	}
	if err := unix.Mount("tracefs", tracefsRoot, "tracefs", 0, ""); err != nil {
		t.Fatalf("mount tracefs on %s: %v", tracefsRoot, err)
	}
}

func (ti *traceInstance) eventFile(ev, file string) string {
	return filepath.Join(ti.dir, "events", ev, file)
}

// clear empties the ring buffer of the instance.
func (ti *traceInstance) clear(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(ti.dir, "trace"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatalf("clear trace buffer: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("clear trace buffer: %v", err)
	}
}

// traceEvent is one record of the trace buffer.
type traceEvent struct {
	Name   string
	Fields map[string]string
	Raw    string
}

func (e traceEvent) uint(t testing.TB, key string) uint64 {
	t.Helper()
	v, ok := e.Fields[key]
	if !ok {
		t.Fatalf("event %s has no field %q: %s", e.Name, key, e.Raw)
	}
	n, err := strconv.ParseUint(v, 0, 64)
	if err != nil {
		t.Fatalf("event %s field %s=%q is not a number: %s", e.Name, key, v, e.Raw)
	}
	return n
}

func (e traceEvent) int(t testing.TB, key string) int64 {
	t.Helper()
	v, ok := e.Fields[key]
	if !ok {
		t.Fatalf("event %s has no field %q: %s", e.Name, key, e.Raw)
	}
	n, err := strconv.ParseInt(v, 0, 64)
	if err != nil {
		t.Fatalf("event %s field %s=%q is not a number: %s", e.Name, key, v, e.Raw)
	}
	return n
}

func (e traceEvent) str(t testing.TB, key string) string {
	t.Helper()
	v, ok := e.Fields[key]
	if !ok {
		t.Fatalf("event %s has no field %q: %s", e.Name, key, e.Raw)
	}
	return v
}

// isInode reports whether the event names the inode st describes: same
// inode number and same device ("dev 254:16" in xfs events, "dev 254,16"
// in ext4 events, "dev=254:16" in overlayfs events).
func (e traceEvent) isInode(st unix.Stat_t) bool {
	ino, err := strconv.ParseUint(e.Fields["ino"], 0, 64)
	if err != nil || ino != st.Ino {
		return false
	}
	return e.Fields["dev"] == devString(st.Dev)
}

func devString(dev uint64) string {
	return fmt.Sprintf("%d:%d", unix.Major(dev), unix.Minor(dev))
}

var traceLine = regexp.MustCompile(`\s\d+\.\d+: ([a-z0-9_]+): (.*)$`)

// events returns the records in the buffer, oldest first.
func (ti *traceInstance) events(t testing.TB) []traceEvent {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ti.dir, "trace"))
	if err != nil {
		t.Fatalf("read trace buffer: %v", err)
	}
	var out []traceEvent
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "#") {
			if strings.Contains(line, "LOST") {
				t.Fatalf("trace buffer lost events: %s", line)
			}
			continue
		}
		m := traceLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		out = append(out, traceEvent{Name: m[1], Fields: parseFields(m[2]), Raw: line})
	}
	return out
}

// parseFields reads both conventions of event formats: "key=value" pairs
// and the "key value" pairs of ext4 and xfs. A device written "254,16" is
// normalised to "254:16".
func parseFields(s string) map[string]string {
	f := map[string]string{}
	tok := strings.Fields(s)
	for i := 0; i < len(tok); i++ {
		if k, v, ok := strings.Cut(tok[i], "="); ok {
			f[k] = v
			continue
		}
		if i+1 < len(tok) {
			f[tok[i]] = tok[i+1]
			i++
		}
	}
	if d, ok := f["dev"]; ok {
		f["dev"] = strings.Replace(d, ",", ":", 1)
	}
	return f
}

// named returns the events called name.
func named(evs []traceEvent, name string) []traceEvent {
	var out []traceEvent
	for _, e := range evs {
		if e.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// forInode returns the names of the events about the inode st, in order.
func forInode(evs []traceEvent, st unix.Stat_t) []string {
	var out []string
	for _, e := range evs {
		if e.isInode(st) {
			out = append(out, e.Name)
		}
	}
	return out
}

func lastIndex(names []string, name string) int {
	for i := len(names) - 1; i >= 0; i-- {
		if names[i] == name {
			return i
		}
	}
	return -1
}

func firstIndex(names []string, name string) int {
	for i, n := range names {
		if n == name {
			return i
		}
	}
	return -1
}
