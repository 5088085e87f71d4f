//go:build ovlkit_guest

// Package fuselower shows what overlayfs does with a FUSE lower layer whose
// getxattr of the opaque xattr fails or returns odd values. virtiofs and
// FUSE servers answer getxattr with whatever their backing store or their
// own policy gives (EIO, EPERM, ENOTSUP, ...), and stock kernels take every
// such answer as "not opaque", so these lowers are readable. The series'
// opaque-xattr validation must keep that by default and fail lookups only
// under the strict_opaque mount option.
//
// The FUSE server runs inside the test binary (go-fuse, mounted with
// mount(2) directly: the guest has /dev/fuse but no fusermount).
package fuselower

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// Contents of the files the FUSE lower serves, read back through the
// overlay to show that the lower is usable.
const (
	fileContent = "file in the FUSE lower\n"
	topContent  = "top of the FUSE lower\n"
)

// opaqueNames are the names overlayfs reads the opaque xattr under: the
// trusted namespace by default, the user namespace with userxattr.
var opaqueNames = []string{"trusted.overlay.opaque", "user.overlay.opaque"}

// opaqueAnswer is what the FUSE server answers to a getxattr of the opaque
// xattr on directory d: errno when non-zero, value otherwise.
type opaqueAnswer struct {
	errno syscall.Errno
	value string
}

// lowerRoot is the root of the FUSE lower: d/f, and top.
type lowerRoot struct {
	fs.Inode
	dir *opaqueDir
}

var _ = (fs.NodeOnAdder)((*lowerRoot)(nil))

// OnAdd builds the tree when the file system is mounted. The inodes are
// persistent: the tree lives as long as the mount, whatever the kernel
// forgets.
func (r *lowerRoot) OnAdd(ctx context.Context) {
	d := r.NewPersistentInode(ctx, r.dir, fs.StableAttr{Mode: syscall.S_IFDIR})
	r.AddChild("d", d, false)
	f := d.NewPersistentInode(ctx, &fs.MemRegularFile{
		Data: []byte(fileContent),
		Attr: fuse.Attr{Mode: 0o644},
	}, fs.StableAttr{Mode: syscall.S_IFREG})
	d.AddChild("f", f, false)
	top := r.NewPersistentInode(ctx, &fs.MemRegularFile{
		Data: []byte(topContent),
		Attr: fuse.Attr{Mode: 0o644},
	}, fs.StableAttr{Mode: syscall.S_IFREG})
	r.AddChild("top", top, false)
}

// opaqueDir is directory d. Its getxattr of the opaque xattr answers as
// configured; every other name has no value (ENODATA), and its xattr list
// is empty.
type opaqueDir struct {
	fs.Inode
	answer opaqueAnswer

	mu    sync.Mutex
	calls map[string]int // getxattr requests per opaque xattr name
}

var (
	_ = (fs.NodeGetxattrer)((*opaqueDir)(nil))
	_ = (fs.NodeListxattrer)((*opaqueDir)(nil))
	_ = (fs.NodeGetattrer)((*opaqueDir)(nil))
)

func (d *opaqueDir) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o755
	return 0
}

func (d *opaqueDir) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if attr != opaqueNames[0] && attr != opaqueNames[1] {
		return 0, syscall.ENODATA
	}
	d.mu.Lock()
	d.calls[attr]++
	d.mu.Unlock()
	if d.answer.errno != 0 {
		return 0, d.answer.errno
	}
	// The kernel asks with a buffer of its own size: a value that does
	// not fit is ERANGE with the size needed, as getxattr(2) has it.
	if len(dest) < len(d.answer.value) {
		return uint32(len(d.answer.value)), syscall.ERANGE
	}
	return uint32(copy(dest, d.answer.value)), 0
}

func (d *opaqueDir) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	return 0, 0
}

// Calls returns how many getxattr requests for name reached the server.
func (d *opaqueDir) Calls(name string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[name]
}

// startLower mounts a FUSE lower answering a on an empty directory dir and
// serves it from this process until the test ends. It returns directory d
// to count the requests the kernel made.
func startLower(t testing.TB, dir string, a opaqueAnswer) *opaqueDir {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("mkdir %s: %v", dir, err)
	}
	d := &opaqueDir{answer: a, calls: map[string]int{}}
	// Short timeouts would only add revalidation requests; each case
	// mounts its own server, so nothing needs to expire.
	timeout := time.Minute
	srv, err := fs.Mount(dir, &lowerRoot{dir: d}, &fs.Options{
		EntryTimeout: &timeout,
		AttrTimeout:  &timeout,
		MountOptions: fuse.MountOptions{
			// mount(2) directly, without fusermount (the guest has
			// none), and fail rather than look for it.
			DirectMountStrict: true,
			// Overlayfs reads the lower with the mounter's
			// credentials, which are root here as well; allow_other
			// keeps that true for any caller.
			AllowOther: true,
			FsName:     "ovlkit-fuselower",
			Name:       "fuselower",
		},
	})
	if err != nil {
		t.Fatalf("mount FUSE lower on %s: %v", dir, err)
	}
	guesttest.UnmountFUSEOnCleanup(t, "FUSE lower", dir, srv.Unmount)
	if err := checkLower(dir); err != nil {
		t.Fatalf("FUSE lower on %s: %v", dir, err)
	}
	return d
}

// checkLower reads the FUSE mount directly, so that a broken server shows
// as such rather than as an overlay result.
func checkLower(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "d", "f"))
	if err != nil {
		return fmt.Errorf("read d/f: %w", err)
	}
	if string(b) != fileContent {
		return fmt.Errorf("d/f holds %q, want %q", b, fileContent)
	}
	return nil
}
