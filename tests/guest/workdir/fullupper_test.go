//go:build ovlkit_guest

package workdir

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// fillInodes creates empty files in dir until the filesystem has no free
// inode left and returns their paths.
func fillInodes(t *testing.T, dir string) []string {
	t.Helper()
	guestfs.MkdirAll(t, dir)
	var files []string
	for i := 0; ; i++ {
		p := filepath.Join(dir, fmt.Sprintf("f%d", i))
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			if errnoOf(err) != unix.ENOSPC {
				t.Fatalf("fill inodes: create %s: %v", p, err)
			}
			return files
		}
		f.Close()
		files = append(files, p)
		if i > 1<<16 {
			t.Fatalf("fill inodes: %s never ran out of inodes", dir)
		}
	}
}

// dirTimes returns the modification and change times of dir. Creating a
// name in a directory or renaming one out of it updates both; an O_TMPFILE
// file created in it does not.
func dirTimes(t *testing.T, dir string) [2]unix.Timespec {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatalf("stat %s: %v", dir, err)
	}
	return [2]unix.Timespec{st.Mtim, st.Ctim}
}

// fullUpperWithWorkdir makes layers on a small tmpfs, mounts and unmounts
// them once so that work/work exists, then uses up every free inode. A
// mount then only re-creates work/work in the inode its cleanup frees,
// and every feature probe that needs a new inode gets ENOSPC. It returns
// the layers and the filler files.
func fullUpperWithWorkdir(t *testing.T) (guesttest.Layers, []string) {
	t.Helper()
	base := guesttest.FS{Name: "tmpfs"}.Scratch(t, "size=16m,nr_inodes=64")
	l := guesttest.NewLayers(t, base, 1)
	guestfs.WriteFile(t, filepath.Join(l.Lower[0], "f"), "lower data")
	guestfs.MkdirAll(t, filepath.Join(l.Lower[0], "d"))

	l.Mount(t)
	l.Unmount(t)

	filler := fillInodes(t, filepath.Join(base, "filler"))
	if len(filler) < 4 {
		t.Fatalf("only %d filler files fit; the test needs a few to free later", len(filler))
	}
	return l, filler
}

// An upper filesystem without free inodes at mount time: the feature probes
// cannot create their test objects. The mount must still succeed and stay
// writable. The RENAME_WHITEOUT probe's ENOSPC counts as "not supported"
// (a warning); the O_TMPFILE and xattr probes' ENOSPC leave tmpfile
// copy-up and the xattr features on.
func TestFullUpperInodesAtMount(t *testing.T) {
	guesttest.Proves(t, subjectFullUpper)
	l, filler := fullUpperWithWorkdir(t)

	kmsg := guesttest.OpenKmsg(t)
	if err := l.TryMount(t); err != nil {
		t.Fatalf("mount with no free inode on the upper fs: %v", err)
	}
	sawWhiteout := false
	for _, line := range kmsg.Lines(t) {
		if strings.Contains(line, "RENAME_WHITEOUT") {
			sawWhiteout = true
		}
		if strings.Contains(line, "does not support tmpfile") || strings.Contains(line, "failed to set xattr") {
			t.Errorf("tmpfile or xattr turned off because the upper fs was full: %q", line)
		}
	}
	if !sawWhiteout {
		t.Errorf("no warning about the RENAME_WHITEOUT probe on a full upper fs")
	}
	opts := mountOptions(t, l.Merged)
	if slices.Contains(opts, "ro") {
		t.Fatalf("overlay on a full upper fs is read-only: %v", opts)
	}

	b, err := os.ReadFile(filepath.Join(l.Merged, "f"))
	if err != nil || string(b) != "lower data" {
		t.Errorf("read lower file: %q, %v", b, err)
	}
	// Writable, but full: creating needs an inode.
	err = os.WriteFile(filepath.Join(l.Merged, "new"), nil, 0o644)
	if errnoOf(err) != unix.ENOSPC {
		t.Errorf("create on the full upper fs: got %v, want ENOSPC", err)
	}

	for _, p := range filler[:4] {
		if err := os.Remove(p); err != nil {
			t.Fatalf("free an inode: %v", err)
		}
	}

	// Copy-up through the work dir creates a temporary file there and
	// renames it, which changes the times of work/work; O_TMPFILE
	// copy-up leaves them alone. The wait lets the kernel's coarse clock
	// move on, so that a change would show.
	workWork := filepath.Join(l.Work, "work")
	before := dirTimes(t, workWork)
	time.Sleep(20 * time.Millisecond)
	f, err := os.OpenFile(filepath.Join(l.Merged, "f"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatalf("open lower file for write (copy-up): %v", err)
	}
	if _, err := f.WriteString("+"); err != nil {
		t.Errorf("append after copy-up: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if after := dirTimes(t, workWork); after != before {
		t.Errorf("copy-up went through the work dir (tmpfile turned off at mount): work/work times %v -> %v", before, after)
	}
	b, err = os.ReadFile(filepath.Join(l.Upper, "f"))
	if err != nil || string(b) != "lower data+" {
		t.Errorf("copied-up file in upper: %q, %v", b, err)
	}

	// Directories are always copied up through the work dir: this shows
	// that the times above would have changed if the file had been too.
	before = dirTimes(t, workWork)
	time.Sleep(20 * time.Millisecond)
	if err := os.Mkdir(filepath.Join(l.Merged, "d", "x"), 0o755); err != nil {
		t.Fatalf("mkdir in a lower dir (directory copy-up): %v", err)
	}
	if after := dirTimes(t, workWork); after == before {
		t.Errorf("directory copy-up through the work dir left the work/work times unchanged (%v)", before)
	}
}

// With strict_upper, a full upper at mount time fails the mount with
// EINVAL: the RENAME_WHITEOUT probe's ENOSPC counts as a missing feature,
// while the O_TMPFILE probe's does not.
func TestFullUpperInodesAtMountStrict(t *testing.T) {
	guesttest.Proves(t, subjectFullUpper)
	l, _ := fullUpperWithWorkdir(t)

	kmsg := guesttest.OpenKmsg(t)
	err := l.TryMount(t, "strict_upper")
	if errnoOf(err) != unix.EINVAL {
		t.Fatalf("strict_upper mount with no free inode on the upper fs: got %v, want EINVAL", err)
	}
	msg := kmsg.Expect(t, missingFeaturesMsg)
	if !strings.Contains(msg, "RENAME_WHITEOUT") {
		t.Errorf("kernel message %q does not name RENAME_WHITEOUT", msg)
	}
	if strings.Contains(msg, "O_TMPFILE") {
		t.Errorf("kernel message %q names O_TMPFILE, whose probe only ran out of inodes", msg)
	}
}

// fullUpperWithoutWorkdir makes layers on a small tmpfs whose inodes are
// used up before any mount, so that work/work cannot be created.
func fullUpperWithoutWorkdir(t *testing.T) guesttest.Layers {
	t.Helper()
	base := guesttest.FS{Name: "tmpfs"}.Scratch(t, "size=16m,nr_inodes=64")
	l := guesttest.NewLayers(t, base, 1)
	guestfs.WriteFile(t, filepath.Join(l.Lower[0], "f"), "lower data")
	fillInodes(t, filepath.Join(base, "filler"))
	if _, err := os.Stat(filepath.Join(l.Work, "work")); !os.IsNotExist(err) {
		t.Fatalf("work/work before the first mount: got %v, want ENOENT", err)
	}
	return l
}

// A full upper where work/work does not exist yet: mkdir fails with ENOSPC
// and a plain mount comes up read-only, as it always has.
func TestFullUpperNoWorkdir(t *testing.T) {
	guesttest.Keeps(t, "a full upper without a work dir mounts read-only")
	l := fullUpperWithoutWorkdir(t)

	kmsg := guesttest.OpenKmsg(t)
	l.Mount(t)
	msg := kmsg.Expect(t, "failed to create directory")
	if !strings.Contains(msg, "mounting read-only") || !strings.Contains(msg, fmt.Sprintf("errno: %d", int(unix.ENOSPC))) {
		t.Errorf("kernel message %q does not report ENOSPC and read-only", msg)
	}
	if !slices.Contains(mountOptions(t, l.Merged), "ro") {
		t.Errorf("mount without a work dir is not read-only: %v", mountOptions(t, l.Merged))
	}
	if b, err := os.ReadFile(filepath.Join(l.Merged, "f")); err != nil || string(b) != "lower data" {
		t.Errorf("read lower file: %q, %v", b, err)
	}
}

// With strict_upper the same mount fails with the error of mkdir, ENOSPC,
// instead of coming up read-only: strict_upper's rule for a work dir that
// cannot be created, which the ENOSPC patch leaves as it is.
func TestFullUpperNoWorkdirStrict(t *testing.T) {
	guesttest.Proves(t, subjectStrictUpper)
	l := fullUpperWithoutWorkdir(t)

	kmsg := guesttest.OpenKmsg(t)
	err := l.TryMount(t, "strict_upper")
	if errnoOf(err) != unix.ENOSPC {
		t.Fatalf("strict_upper mount on a full upper without a work dir: got %v, want ENOSPC", err)
	}
	if msg := kmsg.Expect(t, "failed to create directory"); strings.Contains(msg, "read-only") {
		t.Errorf("strict_upper mount still talks of read-only: %q", msg)
	}
}
