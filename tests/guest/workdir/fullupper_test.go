//go:build ovlkit_guest

package workdir

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// fillInodes creates empty files in dir until the filesystem has no free
// inode left and returns their paths.
func fillInodes(t *testing.T, dir string) []string {
	t.Helper()
	mkdir(t, dir)
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

// An upper filesystem without free inodes at mount time: the feature probes
// cannot create their test objects. The mount must still succeed, stay
// writable and keep O_TMPFILE copy-up.
func TestFullUpperInodesAtMount(t *testing.T) {
	guesttest.Proves(t, subjectFullUpper)
	base := guesttest.FS{Name: "tmpfs"}.Scratch(t, "size=16m,nr_inodes=64")
	l := guesttest.NewLayers(t, base, 1)
	writeFile(t, filepath.Join(l.Lower[0], "f"), "lower data")
	mkdir(t, filepath.Join(l.Lower[0], "d"))

	// A first mount creates work/work; the mount under test then only
	// re-creates it in the inode its cleanup frees.
	l.Mount(t)
	l.Unmount(t)

	filler := fillInodes(t, filepath.Join(base, "filler"))
	if len(filler) < 4 {
		t.Fatalf("only %d filler files fit; the test needs a few to free later", len(filler))
	}

	kmsg := guesttest.OpenKmsg(t)
	if err := l.TryMount(t); err != nil {
		t.Fatalf("mount with no free inode on the upper fs: %v", err)
	}
	for _, line := range kmsg.Lines(t) {
		if strings.Contains(line, "does not support") {
			t.Errorf("feature reported unsupported because the upper fs was full: %q", line)
		}
	}
	opts := mountOptions(t, l.Merged)
	if hasOption(opts, "ro") {
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
