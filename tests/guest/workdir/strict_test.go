//go:build ovlkit_guest

package workdir

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

const missingFeaturesMsg = "upper fs missing required features"

// ramfs has no xattr and no RENAME_WHITEOUT support but d_type and
// O_TMPFILE: a plain mount degrades, strict_upper names what is missing.
func TestStrictUpperRamfs(t *testing.T) {
	guesttest.Proves(t, subjectStrictUpper)
	l := guesttest.NewLayers(t, mountRamfs(t), 1)
	guestfs.WriteFile(t, filepath.Join(l.Lower[0], "f"), "lower")

	// Without the option nothing changes: the mount succeeds.
	l.Mount(t)
	l.Unmount(t)

	kmsg := guesttest.OpenKmsg(t)
	err := l.TryMount(t, "strict_upper")
	if errnoOf(err) != unix.EINVAL {
		t.Fatalf("strict_upper mount on ramfs: got %v, want EINVAL", err)
	}
	msg := kmsg.Expect(t, missingFeaturesMsg)
	for _, want := range []string{" xattr", "RENAME_WHITEOUT"} {
		if !strings.Contains(msg, want) {
			t.Errorf("kernel message %q does not name %q", msg, want)
		}
	}
	for _, present := range []string{"d_type", "O_TMPFILE"} {
		if strings.Contains(msg, present) {
			t.Errorf("kernel message %q names %q, which ramfs supports", msg, present)
		}
	}
}

// mountRamfs mounts a fresh ramfs beneath a tmpfs scratch dir and returns
// its mount point; both go away at the end of the test.
func mountRamfs(t *testing.T) string {
	t.Helper()
	scratch := guesttest.FS{Name: "tmpfs"}.Scratch(t, "")
	base := filepath.Join(scratch, "ramfs")
	guestfs.MkdirAll(t, base)
	if err := unix.Mount("ramfs", base, "ramfs", 0, ""); err != nil {
		t.Fatalf("mount ramfs: %v", err)
	}
	return base
}

// An upper without RENAME_WHITEOUT and xattr support (ramfs): a plain
// mount succeeds read-write with a warning for each missing feature, and
// whiteouts (made with mknod) and copy-up work.
func TestUpperWithoutWhiteoutSupport(t *testing.T) {
	guesttest.Keeps(t, "a plain mount on an upper without RENAME_WHITEOUT and xattr succeeds with warnings")
	l := guesttest.NewLayers(t, mountRamfs(t), 1)
	guestfs.WriteFile(t, filepath.Join(l.Lower[0], "f"), "lower")
	guestfs.WriteFile(t, filepath.Join(l.Lower[0], "g"), "lower")
	guestfs.MkdirAll(t, filepath.Join(l.Lower[0], "d"))

	kmsg := guesttest.OpenKmsg(t)
	l.Mount(t)
	var sawWhiteout, sawXattr bool
	for _, line := range kmsg.Lines(t) {
		sawWhiteout = sawWhiteout || strings.Contains(line, "does not support RENAME_WHITEOUT")
		sawXattr = sawXattr || strings.Contains(line, "failed to set xattr on upper")
	}
	if !sawWhiteout || !sawXattr {
		t.Errorf("warnings on ramfs: RENAME_WHITEOUT %v, xattr %v; want both", sawWhiteout, sawXattr)
	}
	if opts := mountOptions(t, l.Merged); slices.Contains(opts, "ro") {
		t.Fatalf("overlay on ramfs is read-only: %v", opts)
	}

	if err := os.Remove(filepath.Join(l.Merged, "f")); err != nil {
		t.Errorf("unlink of a lower file: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(l.Merged, "f")); !os.IsNotExist(err) {
		t.Errorf("f after unlink: got %v, want ENOENT", err)
	}
	if err := os.WriteFile(filepath.Join(l.Merged, "g"), []byte("upper"), 0o644); err != nil {
		t.Errorf("write to a lower file (copy-up): %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(l.Upper, "g")); err != nil || string(b) != "upper" {
		t.Errorf("copied-up g in upper: %q, %v", b, err)
	}
	if err := os.Mkdir(filepath.Join(l.Merged, "d", "x"), 0o755); err != nil {
		t.Errorf("directory copy-up: %v", err)
	}
}

// A work dir that cannot be created makes a plain mount read-only and a
// strict_upper mount fail with the error of the creation.
func TestStrictUpperUncreatableWorkdir(t *testing.T) {
	guesttest.Proves(t, subjectStrictUpper)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		base := fs.Scratch(t, "")
		l := guesttest.NewLayers(t, base, 1)
		guestfs.WriteFile(t, filepath.Join(l.Lower[0], "f"), "lower")
		guestfs.SetImmutable(t, l.Work, true)
		t.Cleanup(func() { guestfs.SetImmutable(t, l.Work, false) })

		kmsg := guesttest.OpenKmsg(t)
		l.Mount(t)
		kmsg.Expect(t, "mounting read-only")
		if !slices.Contains(mountOptions(t, l.Merged), "ro") {
			t.Errorf("plain mount without a work dir is not read-only: %v", mountOptions(t, l.Merged))
		}
		l.Unmount(t)

		err := l.TryMount(t, "strict_upper")
		if errnoOf(err) != unix.EPERM {
			t.Fatalf("strict_upper mount with an immutable work base: got %v, want EPERM from mkdir", err)
		}
		msg := kmsg.Expect(t, "failed to create directory")
		if strings.Contains(msg, "read-only") {
			t.Errorf("strict_upper mount still talks of read-only: %q", msg)
		}
	})
}

// strict_upper does not change the in-use policy of upper and work dirs:
// with index=off a mount sharing another's upper or work dir succeeds with
// the in-use warning (sharing is safe since the work dir is no longer torn
// down under the other mount), and with index=on it is EBUSY, both as
// without the option. The test proves the option only in that stock
// refuses it as unknown; the in-use behaviour it checks is stock's.
func TestStrictUpperInUse(t *testing.T) {
	guesttest.Proves(t, subjectStrictUpper)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		base := fs.Scratch(t, "")
		a := guesttest.NewLayers(t, base, 1)
		guestfs.WriteFile(t, filepath.Join(a.Lower[0], "f"), "lower")
		guestfs.WriteFile(t, filepath.Join(a.Lower[0], "g"), "lower")
		guestfs.MkdirAll(t, filepath.Join(a.Lower[0], "d"))
		a.Mount(t, "index=off")

		// inUse checks that the in-use warning names dir.
		inUse := func(kmsg *guesttest.Kmsg, dir string) {
			t.Helper()
			if msg := kmsg.Expect(t, inUseMsg); !strings.HasPrefix(strings.TrimPrefix(msg, "overlayfs: "), dir) {
				t.Errorf("in-use message does not name the %s: %q", dir, msg)
			}
		}

		kmsg := guesttest.OpenKmsg(t)
		sameUpper := secondMount(t, a, base, "merged-upper")
		sameUpper.Work = filepath.Join(base, "work-b")
		guestfs.MkdirAll(t, sameUpper.Work)
		if err := sameUpper.TryMount(t, "index=off", "strict_upper"); err != nil {
			t.Fatalf("strict_upper mount sharing the upper dir with index=off: %v", err)
		}
		inUse(kmsg, "upperdir")
		if opts := mountOptions(t, sameUpper.Merged); !slices.Contains(opts, "strict_upper") {
			t.Errorf("/proc/mounts options %v lack strict_upper", opts)
		}

		sameWork := secondMount(t, a, base, "merged-work")
		sameWork.Upper = filepath.Join(base, "upper-c")
		guestfs.MkdirAll(t, sameWork.Upper)
		if err := sameWork.TryMount(t, "index=off", "strict_upper"); err != nil {
			t.Fatalf("strict_upper mount sharing the work dir with index=off: %v", err)
		}
		inUse(kmsg, "workdir")

		busyUpper := secondMount(t, a, base, "merged-busy-upper")
		busyUpper.Work = filepath.Join(base, "work-d")
		guestfs.MkdirAll(t, busyUpper.Work)
		err := busyUpper.TryMount(t, "index=on", "strict_upper")
		if errnoOf(err) != unix.EBUSY {
			t.Errorf("strict_upper mount sharing the upper dir with index=on: got %v, want EBUSY", err)
		}
		inUse(kmsg, "upperdir")

		busyWork := secondMount(t, a, base, "merged-busy-work")
		busyWork.Upper = filepath.Join(base, "upper-e")
		guestfs.MkdirAll(t, busyWork.Upper)
		err = busyWork.TryMount(t, "index=on", "strict_upper")
		if errnoOf(err) != unix.EBUSY {
			t.Errorf("strict_upper mount sharing the work dir with index=on: got %v, want EBUSY", err)
		}
		inUse(kmsg, "workdir")

		// Every mount that came up works, the first one included.
		if err := os.Remove(filepath.Join(a.Merged, "f")); err != nil {
			t.Errorf("unlink in the first mount: %v", err)
		}
		if err := os.Remove(filepath.Join(sameUpper.Merged, "g")); err != nil {
			t.Errorf("unlink in the mount sharing the upper dir: %v", err)
		}
		if err := os.Mkdir(filepath.Join(sameWork.Merged, "d", "x"), 0o755); err != nil {
			t.Errorf("directory copy-up in the mount sharing the work dir: %v", err)
		}
		if err := os.Mkdir(filepath.Join(a.Merged, "d", "y"), 0o755); err != nil {
			t.Errorf("mkdir in the first mount after the others: %v", err)
		}
	})
}

// On a capable upper a strict_upper mount succeeds, works and shows the
// option in /proc/mounts.
func TestStrictUpperAccepted(t *testing.T) {
	guesttest.Proves(t, subjectStrictUpper)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		base := fs.Scratch(t, "")
		l := guesttest.NewLayers(t, base, 1)
		guestfs.WriteFile(t, filepath.Join(l.Lower[0], "f"), "lower")
		guestfs.MkdirAll(t, filepath.Join(l.Lower[0], "d"))

		kmsg := guesttest.OpenKmsg(t)
		l.Mount(t, "strict_upper")
		opts := mountOptions(t, l.Merged)
		if !slices.Contains(opts, "strict_upper") {
			t.Errorf("/proc/mounts options %v lack strict_upper", opts)
		}
		if slices.Contains(opts, "ro") {
			t.Errorf("strict_upper mount is read-only: %v", opts)
		}
		for _, line := range kmsg.Lines(t) {
			if strings.Contains(line, missingFeaturesMsg) || strings.Contains(line, "does not support") {
				t.Errorf("unexpected kernel message on a capable upper: %q", line)
			}
		}

		if err := os.Remove(filepath.Join(l.Merged, "f")); err != nil {
			t.Errorf("unlink lower file: %v", err)
		}
		if err := os.Mkdir(filepath.Join(l.Merged, "d", "x"), 0o755); err != nil {
			t.Errorf("directory copy-up: %v", err)
		}
	})
}
