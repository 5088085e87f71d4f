//go:build ovlkit_guest

// Package fuseupper shows what overlayfs does with a FUSE upper layer whose
// server cannot create unnamed files (O_TMPFILE). Such servers are common:
// the FUSE protocol only has TMPFILE since 7.37, and a server built on a
// store without unnamed files answers ENOSYS. Overlayfs probes O_TMPFILE
// when it mounts; the series takes a probe that fails with ENOSPC or
// EDQUOT as "supported", so the first tmpfile copy-up may learn only then
// that the upper has no tmpfile, and must fall back to the work dir.
//
// The FUSE server runs inside the test binary (go-fuse, mounted with
// mount(2) directly: the guest has /dev/fuse but no fusermount). It is
// go-fuse's loopback over a directory of a tmpfs, which gives overlayfs
// what it requires of a remote upper: trusted.* xattrs, d_type in readdir
// and rename with RENAME_WHITEOUT (the loopback passes rename flags to
// renameat2).
package fuseupper

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// holdTimeout bounds how long a held TMPFILE request waits for the others
// (see upperFS.together): long enough for every copy-up of a test to reach
// the server under TCG, short enough that a kernel that sends them one at
// a time (which fails the test) costs seconds, not a hang. The stock
// kernel sends none.
const holdTimeout = 3 * time.Second

// upperFS is the raw file system the kernel talks to: go-fuse's loopback,
// except that TMPFILE never creates a file and gets the answers the test
// chose, and that it records the requests that create or move names, so a
// test can tell how overlayfs copied a file up: through the work dir
// (MKNOD of a "#N" temporary, RENAME to the name) or with O_TMPFILE
// (TMPFILE, then LINK to the name).
//
// ENOSYS is what a server without unnamed files answers; the kernel's FUSE
// client turns it into EOPNOTSUPP and stops sending TMPFILE on that
// connection. EOPNOTSUPP goes back to the caller as it is, and the client
// keeps asking, so only overlayfs can stop the requests. ENOSPC is a
// server whose store is full when overlayfs probes it at mount.
type upperFS struct {
	fuse.RawFileSystem

	// answers[i] answers the i-th TMPFILE request; the last one answers
	// every later request.
	answers []syscall.Errno
	// together > 1 holds every TMPFILE request after the first (the
	// mount-time probe) until that many of them wait at once, or
	// holdTimeout passes, so that concurrent copy-ups all send TMPFILE
	// before any gets its answer.
	together int

	mu         sync.Mutex
	tmpfiles   []syscall.Errno // the answer to each TMPFILE request, in order
	ops        []string        // "mknod NAME", "create NAME", "rename OLD NEW", "link NAME", "tmpfile"
	waiting    int             // held TMPFILE requests now
	maxWaiting int             // most held TMPFILE requests at once
	release    chan struct{}   // closed when together requests wait
}

func (u *upperFS) record(op string) {
	u.mu.Lock()
	u.ops = append(u.ops, op)
	u.mu.Unlock()
}

// Tmpfile answers without creating anything, as answers says, after
// holding the request if together says so.
func (u *upperFS) Tmpfile(cancel <-chan struct{}, in *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	u.mu.Lock()
	i := len(u.tmpfiles)
	errno := u.answers[min(i, len(u.answers)-1)]
	u.tmpfiles = append(u.tmpfiles, errno)
	u.ops = append(u.ops, "tmpfile")
	var release chan struct{}
	if i > 0 && u.together > 1 {
		release = u.release
		u.waiting++
		u.maxWaiting = max(u.maxWaiting, u.waiting)
		if u.waiting == u.together {
			close(u.release)
		}
	}
	u.mu.Unlock()
	if release != nil {
		timer := time.NewTimer(holdTimeout)
		select {
		case <-release:
		case <-timer.C:
		case <-cancel:
		}
		timer.Stop()
		u.mu.Lock()
		u.waiting--
		u.mu.Unlock()
	}
	return fuse.Status(errno)
}

func (u *upperFS) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	u.record("mknod " + name)
	return u.RawFileSystem.Mknod(cancel, in, name, out)
}

func (u *upperFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	u.record("create " + name)
	return u.RawFileSystem.Create(cancel, in, name, out)
}

func (u *upperFS) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	u.record("rename " + oldName + " " + newName)
	return u.RawFileSystem.Rename(cancel, in, oldName, newName)
}

func (u *upperFS) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	u.record("link " + name)
	return u.RawFileSystem.Link(cancel, in, name, out)
}

// Tmpfiles returns the answers to the TMPFILE requests so far.
func (u *upperFS) Tmpfiles() []syscall.Errno {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]syscall.Errno(nil), u.tmpfiles...)
}

// MaxTogether returns the most TMPFILE requests that were held at once.
func (u *upperFS) MaxTogether() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.maxWaiting
}

// Ops returns the recorded requests from index from on, and the index to
// pass next time.
func (u *upperFS) Ops(from int) ([]string, int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.ops[from:]...), len(u.ops)
}

// startUpper serves backing, a directory of the guest's tmpfs, as a FUSE
// file system on the empty directory mnt from this process until the test
// ends. TMPFILE requests get answers (at least one), held as together
// says (see upperFS).
func startUpper(t testing.TB, backing, mnt string, answers []syscall.Errno, together int) *upperFS {
	t.Helper()
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatalf("mkdir %s: %v", mnt, err)
	}
	root, err := fs.NewLoopbackRoot(backing)
	if err != nil {
		t.Fatalf("loopback of %s: %v", backing, err)
	}
	// Only this server changes backing while it is mounted, so the
	// kernel's caches stay true; a short timeout keeps them from
	// mattering anyway.
	timeout := time.Second
	opts := &fs.Options{
		EntryTimeout: &timeout,
		AttrTimeout:  &timeout,
		MountOptions: fuse.MountOptions{
			// mount(2) directly, without fusermount (the guest has
			// none), and fail rather than look for it.
			DirectMountStrict: true,
			// Overlayfs writes the upper with the mounter's
			// credentials, which are root here as well; allow_other
			// keeps that true for any caller.
			AllowOther: true,
			FsName:     "ovlkit-fuseupper",
			Name:       "fuseupper",
		},
	}
	if len(answers) == 0 {
		t.Fatal("startUpper: no TMPFILE answers")
	}
	u := &upperFS{
		RawFileSystem: fs.NewNodeFS(root, opts),
		answers:       answers,
		together:      together,
		release:       make(chan struct{}),
	}
	srv, err := fuse.NewServer(u, mnt, &opts.MountOptions)
	if err != nil {
		t.Fatalf("mount FUSE upper on %s: %v", mnt, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		// The serve loop ends by itself when the mount never happened.
		t.Fatalf("mount FUSE upper on %s: %v", mnt, err)
	}
	guesttest.UnmountFUSEOnCleanup(t, "FUSE upper", mnt, srv.Unmount)
	if err := checkUpper(mnt); err != nil {
		t.Fatalf("FUSE upper on %s: %v", mnt, err)
	}
	return u
}

// checkUpper writes, reads and removes a file and an xattr in the trusted
// namespace through the FUSE mount directly, so that a broken server shows
// as such rather than as an overlay result.
func checkUpper(mnt string) error {
	p := mnt + "/check"
	if err := os.WriteFile(p, []byte("check\n"), 0o644); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if err := unix.Setxattr(p, "trusted.ovlkit", []byte("1"), 0); err != nil {
		return fmt.Errorf("setxattr trusted.ovlkit: %w", err)
	}
	buf := make([]byte, 8)
	n, err := unix.Getxattr(p, "trusted.ovlkit", buf)
	if err != nil || string(buf[:n]) != "1" {
		return fmt.Errorf("getxattr trusted.ovlkit: %q, %v", buf[:n], err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "check\n" {
		return fmt.Errorf("read back: %q, %v", b, err)
	}
	if err := os.Remove(p); err != nil {
		return fmt.Errorf("remove: %w", err)
	}
	return nil
}
