//go:build ovlkit_guest

package workdir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

const missingFeaturesMsg = "upper fs missing required features"

// fsImmutableFL is FS_IMMUTABLE_FL of FS_IOC_SETFLAGS: nothing can be
// created in a directory that has it, not even by root.
const fsImmutableFL = 0x00000010

// setImmutable sets or clears the immutable flag of dir.
func setImmutable(t *testing.T, dir string, on bool) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		t.Fatalf("FS_IOC_GETFLAGS %s: %v", dir, err)
	}
	if on {
		flags |= fsImmutableFL
	} else {
		flags &^= fsImmutableFL
	}
	if err := unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags)); err != nil {
		t.Fatalf("FS_IOC_SETFLAGS %s: %v", dir, err)
	}
}

// ramfs has no xattr and no RENAME_WHITEOUT support but d_type and
// O_TMPFILE: a plain mount degrades, strict_upper names what is missing.
func TestStrictUpperRamfs(t *testing.T) {
	guesttest.Proves(t, subjectStrictUpper)
	scratch := guesttest.FS{Name: "tmpfs"}.Scratch(t, "")
	base := filepath.Join(scratch, "ramfs")
	mkdir(t, base)
	if err := unix.Mount("ramfs", base, "ramfs", 0, ""); err != nil {
		t.Fatalf("mount ramfs: %v", err)
	}
	l := guesttest.NewLayers(t, base, 1)
	writeFile(t, filepath.Join(l.Lower[0], "f"), "lower")

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

// A work dir that cannot be created makes a plain mount read-only and a
// strict_upper mount fail with the error of the creation.
func TestStrictUpperUncreatableWorkdir(t *testing.T) {
	guesttest.Proves(t, subjectStrictUpper)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		base := fs.Scratch(t, "")
		l := guesttest.NewLayers(t, base, 1)
		writeFile(t, filepath.Join(l.Lower[0], "f"), "lower")
		setImmutable(t, l.Work, true)
		t.Cleanup(func() { setImmutable(t, l.Work, false) })

		kmsg := guesttest.OpenKmsg(t)
		l.Mount(t)
		kmsg.Expect(t, "mounting read-only")
		if !hasOption(mountOptions(t, l.Merged), "ro") {
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

// An upper or work dir in use by another mount is EBUSY with strict_upper
// even with index=off, where a plain mount only warns.
func TestStrictUpperInUse(t *testing.T) {
	guesttest.Proves(t, subjectStrictUpper)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		base := fs.Scratch(t, "")
		a := guesttest.NewLayers(t, base, 1)
		writeFile(t, filepath.Join(a.Lower[0], "f"), "lower")
		a.Mount(t, "index=off")

		kmsg := guesttest.OpenKmsg(t)
		sameUpper := secondMount(t, a, base, "merged-upper")
		sameUpper.Work = filepath.Join(base, "work-b")
		mkdir(t, sameUpper.Work)
		err := sameUpper.TryMount(t, "index=off", "strict_upper")
		if errnoOf(err) != unix.EBUSY {
			t.Errorf("strict_upper mount sharing the upper dir: got %v, want EBUSY", err)
		}
		if msg := kmsg.Expect(t, inUseMsg); !strings.HasPrefix(strings.TrimPrefix(msg, "overlayfs: "), "upperdir") {
			t.Errorf("in-use message does not name the upperdir: %q", msg)
		}

		sameWork := secondMount(t, a, base, "merged-work")
		sameWork.Upper = filepath.Join(base, "upper-c")
		mkdir(t, sameWork.Upper)
		err = sameWork.TryMount(t, "index=off", "strict_upper")
		if errnoOf(err) != unix.EBUSY {
			t.Errorf("strict_upper mount sharing the work dir: got %v, want EBUSY", err)
		}
		if msg := kmsg.Expect(t, inUseMsg); !strings.HasPrefix(strings.TrimPrefix(msg, "overlayfs: "), "workdir") {
			t.Errorf("in-use message does not name the workdir: %q", msg)
		}

		// The first mount is unaffected by the refused ones.
		if err := os.Remove(filepath.Join(a.Merged, "f")); err != nil {
			t.Errorf("unlink in the first mount: %v", err)
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
		writeFile(t, filepath.Join(l.Lower[0], "f"), "lower")
		mkdir(t, filepath.Join(l.Lower[0], "d"))

		kmsg := guesttest.OpenKmsg(t)
		l.Mount(t, "strict_upper")
		opts := mountOptions(t, l.Merged)
		if !hasOption(opts, "strict_upper") {
			t.Errorf("/proc/mounts options %v lack strict_upper", opts)
		}
		if hasOption(opts, "ro") {
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
