package ovl

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
)

// writeCounters lays out files as sysfs shows a counter directory: one
// decimal value and a newline per file.
func writeCounters(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o444); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReadCopyUpStats(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "0:42", "copy_up")
	files := map[string]string{}
	want := map[string]uint64{}
	for i, name := range []string{"reg", "dir", "lnk", "spec", "meta", "data", "link",
		"copied_bytes", "cloned_bytes", "hole_bytes", "fsync", "fail_enospc", "fail_eintr", "fail_other"} {
		files[name] = strings.Repeat("1", i%3+1) + "\n"
		want[name] = map[int]uint64{0: 1, 1: 11, 2: 111}[i%3]
	}
	files["copied_bytes"] = "18446744073709551615\n" // the largest u64
	want["copied_bytes"] = 1<<64 - 1
	files["new_counter"] = "7" // a later kernel's counter, without newline
	want["new_counter"] = 7
	writeCounters(t, dir, files)
	// A subdirectory is not a counter.
	if err := os.Mkdir(filepath.Join(dir, "group"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := ReadCopyUpStats(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Errorf("%d counters %v, want %d", len(got), got, len(want))
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %d (present %v), want %d", k, g, ok, v)
		}
	}
}

func TestReadCopyUpStatsEmpty(t *testing.T) {
	got, err := ReadCopyUpStats(t.TempDir())
	if err != nil || len(got) != 0 {
		t.Errorf("empty directory: %v, %v", got, err)
	}
}

func TestReadCopyUpStatsMissing(t *testing.T) {
	_, err := ReadCopyUpStats(filepath.Join(t.TempDir(), "0:42", "copy_up"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing directory: %v, want ErrNotExist", err)
	}
}

// A value that is not one decimal u64 is an error that names the file.
func TestReadCopyUpStatsMalformed(t *testing.T) {
	for _, content := range []string{"", "\n", "-1\n", "1 2\n", "0x10\n", "12\n\n", " 3\n", "abc",
		"18446744073709551616\n", "\x00\xff"} {
		dir := t.TempDir()
		writeCounters(t, dir, map[string]string{"reg": "1\n", "dir": content})
		got, err := ReadCopyUpStats(dir)
		if err == nil {
			t.Errorf("%q accepted: %v", content, got)
			continue
		}
		if !strings.Contains(err.Error(), filepath.Join(dir, "dir")) {
			t.Errorf("%q: error %q does not name the file", content, err)
		}
	}
}

func TestCopyUpDir(t *testing.T) {
	infos := []*mountinfo.Info{
		{Mountpoint: "/", FSType: "ext4", Major: 8, Minor: 1},
		{Mountpoint: "/m", FSType: "overlay", Major: 0, Minor: 40},
		{Mountpoint: "/m", FSType: "overlay", Major: 0, Minor: 41}, // stacked: the visible one
		{Mountpoint: "/t", FSType: "overlay", Major: 0, Minor: 50},
		{Mountpoint: "/t", FSType: "tmpfs", Major: 0, Minor: 51},
	}
	dir, err := copyUpDir(infos, "/m")
	if err != nil || dir != "/sys/fs/overlay/0:41/copy_up" {
		t.Errorf("/m: %q, %v", dir, err)
	}
	for _, mp := range []string{"/t", "/", "/nowhere"} {
		if dir, err := copyUpDir(infos, mp); !errors.Is(err, ErrNotOverlay) {
			t.Errorf("%s: %q, %v; want ErrNotOverlay", mp, dir, err)
		}
	}
}

// A directory that is not a mount point has no counters, whatever the
// host's root filesystem is.
func TestCopyUpStatsNotMounted(t *testing.T) {
	if _, err := CopyUpStats(t.TempDir()); !errors.Is(err, ErrNotOverlay) {
		t.Errorf("temporary directory: %v, want ErrNotOverlay", err)
	}
}
