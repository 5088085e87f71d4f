//go:build ovlkit_guest

package workdir

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// remount calls mount(2) with MS_REMOUNT on target, as `mount -o
// remount,...` does, with flags added and data as the new options.
func remount(target string, flags uintptr, data string) error {
	return unix.Mount("", target, "", unix.MS_REMOUNT|flags, data)
}

// withRO returns opts with the leading rw replaced by ro.
func withRO(opts []string) []string {
	out := slices.Clone(opts)
	for i, o := range out {
		if o == "rw" {
			out[i] = "ro"
		}
	}
	return out
}

// Remounting an overlay read-only and back read-write keeps it working,
// and its options stay what they were: overlay ignores the options of a
// remount on 6.1, which mount(8) passes along from the mount table.
func TestRemountKeepsOptions(t *testing.T) {
	guesttest.Keeps(t, "remount ro and rw keeps the overlay working with its options")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
		guestfs.WriteFile(t, filepath.Join(l.Lower[0], "f"), "lower")
		guestfs.WriteFile(t, filepath.Join(l.Lower[0], "g"), "lower")
		guestfs.MkdirAll(t, filepath.Join(l.Lower[0], "d"))
		l.Mount(t, "index=off")
		opts := mountOptions(t, l.Merged)
		if !slices.Contains(opts, "rw") {
			t.Fatalf("fresh overlay is not read-write: %v", opts)
		}
		if err := os.Remove(filepath.Join(l.Merged, "f")); err != nil {
			t.Fatalf("unlink before the remounts: %v", err)
		}

		if err := remount(l.Merged, unix.MS_RDONLY, ""); err != nil {
			t.Fatalf("remount,ro: %v", err)
		}
		if got, want := mountOptions(t, l.Merged), withRO(opts); !slices.Equal(got, want) {
			t.Errorf("options after remount,ro: %v, want %v", got, want)
		}
		err := os.WriteFile(filepath.Join(l.Merged, "new"), nil, 0o644)
		if errnoOf(err) != unix.EROFS {
			t.Errorf("create after remount,ro: got %v, want EROFS", err)
		}

		// The overlay options the mount was made with, as mount(8)
		// passes them on a remount.
		data := l.Options("index=off")
		if err := remount(l.Merged, 0, data); err != nil {
			t.Fatalf("remount,rw with %q: %v", data, err)
		}
		if got := mountOptions(t, l.Merged); !slices.Equal(got, opts) {
			t.Errorf("options after remount,rw: %v, want %v", got, opts)
		}

		guestfs.WriteFile(t, filepath.Join(l.Merged, "new"), "new")
		if err := os.Remove(filepath.Join(l.Merged, "g")); err != nil {
			t.Errorf("unlink of a lower file after the remounts: %v", err)
		}
		if err := os.Mkdir(filepath.Join(l.Merged, "d", "x"), 0o755); err != nil {
			t.Errorf("directory copy-up after the remounts: %v", err)
		}
		if _, err := os.Lstat(filepath.Join(l.Merged, "f")); !os.IsNotExist(err) {
			t.Errorf("f unlinked before the remounts: got %v, want ENOENT", err)
		}
	})
}

// A remount cannot turn strict_upper off, as it cannot change any other
// overlay option: the remount succeeds and /proc/mounts still shows the
// option.
func TestRemountKeepsStrictUpper(t *testing.T) {
	guesttest.Proves(t, subjectStrictUpper)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
		guestfs.WriteFile(t, filepath.Join(l.Lower[0], "f"), "lower")
		l.Mount(t, "strict_upper")
		opts := mountOptions(t, l.Merged)
		if !slices.Contains(opts, "strict_upper") {
			t.Fatalf("/proc/mounts options %v lack strict_upper", opts)
		}

		if err := remount(l.Merged, 0, "strict_upper=off"); err != nil {
			t.Fatalf("remount,strict_upper=off: %v", err)
		}
		if got := mountOptions(t, l.Merged); !slices.Equal(got, opts) {
			t.Errorf("options after remount,strict_upper=off: %v, want %v", got, opts)
		}
		if err := os.Remove(filepath.Join(l.Merged, "f")); err != nil {
			t.Errorf("unlink of a lower file after the remount: %v", err)
		}
	})
}
