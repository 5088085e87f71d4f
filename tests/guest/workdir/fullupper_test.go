//go:build ovlkit_guest

package workdir

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

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

// watchCreates reports names created in or renamed out of dir from now on.
type watchCreates struct {
	fd int
}

func newWatchCreates(t *testing.T, dir string) *watchCreates {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("inotify_init1: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO); err != nil {
		t.Fatalf("inotify_add_watch %s: %v", dir, err)
	}
	return &watchCreates{fd: fd}
}

// names returns the names of the events seen so far.
func (w *watchCreates) names(t *testing.T) []string {
	t.Helper()
	var out []string
	buf := make([]byte, 4096)
	for {
		n, err := unix.Read(w.fd, buf)
		if err == unix.EAGAIN {
			return out
		}
		if err != nil {
			t.Fatalf("read inotify: %v", err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			// struct inotify_event: wd, mask, cookie, len, name[len].
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			start := off + unix.SizeofInotifyEvent
			out = append(out, strings.TrimRight(string(buf[start:start+nameLen]), "\x00"))
			off = start + nameLen
		}
	}
}

// An upper filesystem without free inodes at mount time: the feature probes
// cannot create their test objects. The mount must still succeed, stay
// writable and keep O_TMPFILE copy-up.
func TestFullUpperInodesAtMount(t *testing.T) {
	guesttest.Proves(t, subjectFullUpper)
	base := guesttest.FS{Name: "tmpfs"}.Scratch(t, "size=16m,nr_inodes=64")
	l := guesttest.NewLayers(t, base, 1)
	writeFile(t, filepath.Join(l.Lower[0], "f"), "lower data")

	// A first mount creates work/work; the mount under test then only
	// re-creates it in the inode its cleanup frees.
	l.Mount(t)
	l.Unmount(t)

	filler := fillInodes(t, filepath.Join(base, "filler"))
	if len(filler) < 3 {
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

	for _, p := range filler[:3] {
		if err := os.Remove(p); err != nil {
			t.Fatalf("free an inode: %v", err)
		}
	}

	// Copy-up through the work dir creates a temporary file there and
	// renames it; O_TMPFILE copy-up never names anything in it.
	w := newWatchCreates(t, filepath.Join(l.Work, "work"))
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
	if names := w.names(t); len(names) != 0 {
		t.Errorf("copy-up went through the work dir (tmpfile turned off at mount): created %v", names)
	}
	b, err = os.ReadFile(filepath.Join(l.Upper, "f"))
	if err != nil || string(b) != "lower data+" {
		t.Errorf("copied-up file in upper: %q, %v", b, err)
	}
}
