//go:build ovlkit_guest

// Package guesttest is what every guest test package uses: the scratch
// filesystems the harness attached (tmpfs always; ext4, xfs and btrfs on
// virtio disks), overlay mount helpers, the kernel log, and the declarations
// that a test proves a patch of the series or keeps stock behaviour.
//
// Guest packages carry the ovlkit_guest build tag: they only make sense as
// root inside the QEMU guest booted by cmd/ovlvm, so a host "go test ./..."
// does not build them at all rather than skipping them.
package guesttest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/moby/sys/mountinfo"
	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/ovl"
	"github.com/ovlkit/ovlkit/vm/guestproto"
)

// Proves declares that t demonstrates the patch whose subject line is given
// (for example "ovl: add strict_upper option to fail instead of degrading").
// The harness checks the subject against patches/6.1 and fails the run if
// the test passes on the stock kernel.
func Proves(t testing.TB, subject string) {
	t.Helper()
	t.Log(guestproto.ProofMarker + subject)
}

// Keeps declares that t guards behaviour the series must leave as the stock
// kernel has it, described by what (for example "rename of a lower
// directory fails with EXDEV without redirect_dir"). Unlike a proof, a
// failure is never excused on the stock kernel, and "ovlvm test" fails the
// run unless the test ran on both kernels. The subtests of t inherit the
// declaration; a test must not declare both Keeps and Proves, and a proof
// must not be nested in a keeps test.
func Keeps(t testing.TB, what string) {
	t.Helper()
	t.Log(guestproto.KeepsMarker + what)
}

// FS is one filesystem the guest can put overlay layers on.
type FS struct {
	Name   string // tmpfs, ext4, xfs, btrfs
	Device string // block device, empty for tmpfs
}

var (
	mountMu sync.Mutex
	mounted = map[string]string{}
)

const scratchRoot = "/mnt/ovlkit"

// Filesystems lists tmpfs and every disk the harness attached, in a stable
// order. The harness names each virtio disk by its filesystem through the
// disk serial, so the mapping does not depend on probe order.
func Filesystems() []FS {
	fss := []FS{{Name: "tmpfs"}}
	devs, _ := filepath.Glob("/sys/block/vd*/serial")
	var disks []FS
	for _, p := range devs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		serial := strings.TrimSpace(string(b))
		name, ok := strings.CutPrefix(serial, guestproto.DiskSerialPrefix)
		if !ok {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(p))
		disks = append(disks, FS{Name: name, Device: dev})
	}
	sort.Slice(disks, func(i, j int) bool { return disks[i].Name < disks[j].Name })
	return append(fss, disks...)
}

// UnfitDisk mounts the disk the harness made for a refusal test ("xfs-ftype0"
// or "vfat", serial ovlunfit-<name>) and returns its mount point, which is
// unmounted when the test ends. The test fails when the disk is missing.
func UnfitDisk(t testing.TB, name string) string {
	t.Helper()
	fstype, _, _ := strings.Cut(name, "-")
	devs, _ := filepath.Glob("/sys/block/vd*/serial")
	for _, p := range devs {
		b, err := os.ReadFile(p)
		if err != nil || strings.TrimSpace(string(b)) != guestproto.UnfitDiskSerialPrefix+name {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(p))
		dir := filepath.Join(scratchRoot, "unfit-"+name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("mkdir %s: %v", dir, err)
		}
		if err := unix.Mount(dev, dir, fstype, 0, ""); err != nil {
			t.Fatalf("mount %s (%s) on %s: %v", dev, fstype, dir, err)
		}
		t.Cleanup(func() {
			UnmountBeneath(t, dir)
			if err := unix.Unmount(dir, 0); err != nil {
				t.Errorf("unmount %s: %v", dir, err)
			}
		})
		return dir
	}
	t.Fatalf("no %s disk in this guest (the harness attaches it unless -fs leaves it out)", name)
	return ""
}

// ReadNames returns the names in dir, sorted, as one opendir/readdir/close.
func ReadNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	got, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	sort.Strings(got)
	return got, nil
}

// ProcfsMountStats parses /proc/self/mountstats with prometheus/procfs,
// exactly as node_exporter's mountstats collector does, and fails the test
// when that reader cannot parse the file.
func ProcfsMountStats(t testing.TB) []*procfs.Mount {
	t.Helper()
	fs, err := procfs.NewFS("/proc")
	if err != nil {
		t.Fatalf("procfs.NewFS: %v", err)
	}
	proc, err := fs.Self()
	if err != nil {
		t.Fatalf("procfs FS.Self: %v", err)
	}
	mounts, err := proc.MountStats()
	if err != nil {
		t.Fatalf("prometheus/procfs cannot parse /proc/self/mountstats: %v", err)
	}
	return mounts
}

// NeedFS returns the scratch filesystem called name. The harness always
// attaches ext4, xfs and btrfs, so a missing one is a failure, not a skip.
func NeedFS(t testing.TB, name string) FS {
	t.Helper()
	for _, fs := range Filesystems() {
		if fs.Name == name {
			return fs
		}
	}
	t.Fatalf("no %s scratch filesystem in this guest", name)
	return FS{}
}

// ForEachFS runs fn as a subtest named after each filesystem. A test that
// needs all four uppers fails when one is missing rather than passing on
// fewer: the harness always attaches ext4, xfs and btrfs.
func ForEachFS(t *testing.T, fn func(t *testing.T, fs FS)) {
	t.Helper()
	fss := Filesystems()
	if want := os.Getenv("OVLKIT_FS"); want != "" {
		var keep []FS
		for _, fs := range fss {
			for _, w := range strings.Split(want, ",") {
				if fs.Name == w {
					keep = append(keep, fs)
				}
			}
		}
		fss = keep
	}
	if len(fss) == 0 {
		t.Fatal("no scratch filesystems in this guest")
	}
	for _, fs := range fss {
		fs := fs
		t.Run(fs.Name, func(t *testing.T) { fn(t, fs) })
	}
}

// root mounts fs once for the whole test binary and returns its mount point.
// tmpfs gets a fresh instance per call of Scratch instead (see there).
func (fs FS) root(t testing.TB) string {
	mountMu.Lock()
	defer mountMu.Unlock()
	if dir, ok := mounted[fs.Name]; ok {
		return dir
	}
	// An earlier test binary in this boot may have mounted the disk: reuse
	// that mount rather than fail with EBUSY.
	if dir := mountPointOf(fs.Device); dir != "" {
		mounted[fs.Name] = dir
		return dir
	}
	dir := filepath.Join(scratchRoot, fs.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("mkdir %s: %v", dir, err)
	}
	if err := unix.Mount(fs.Device, dir, fs.Name, 0, ""); err != nil {
		t.Fatalf("mount %s (%s) on %s: %v", fs.Device, fs.Name, dir, err)
	}
	mounted[fs.Name] = dir
	return dir
}

// Scratch returns a new empty directory on fs, removed when the test ends
// together with every mount left beneath it. On tmpfs each call mounts a new
// tmpfs instance (with opts, e.g. "size=1m,nr_inodes=64"), so a test can fill
// it without disturbing others; on disks opts must be empty.
func (fs FS) Scratch(t testing.TB, opts string) string {
	t.Helper()
	var dir string
	if fs.Name == "tmpfs" {
		if err := os.MkdirAll(scratchRoot, 0o755); err != nil {
			t.Fatalf("mkdir %s: %v", scratchRoot, err)
		}
		d, err := os.MkdirTemp(scratchRoot, "tmpfs-")
		if err != nil {
			t.Fatalf("scratch dir: %v", err)
		}
		if opts == "" {
			opts = "size=256m"
		}
		if err := unix.Mount("tmpfs", d, "tmpfs", 0, opts); err != nil {
			t.Fatalf("mount tmpfs (%s) on %s: %v", opts, d, err)
		}
		dir = d
		t.Cleanup(func() {
			UnmountBeneath(t, d)
			if err := unix.Unmount(d, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount scratch tmpfs %s: %v", d, err)
			}
			os.Remove(d)
		})
		return dir
	}
	if opts != "" {
		t.Fatalf("mount options %q only apply to tmpfs scratch", opts)
	}
	d, err := os.MkdirTemp(fs.root(t), "t-")
	if err != nil {
		t.Fatalf("scratch dir on %s: %v", fs.Name, err)
	}
	t.Cleanup(func() {
		UnmountBeneath(t, d)
		if err := os.RemoveAll(d); err != nil {
			t.Errorf("remove scratch %s: %v", d, err)
		}
	})
	return d
}

// A mount is one line of /proc/self/mounts: its source and mount point.
type mount struct{ source, target string }

func readMounts() ([]mount, error) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	var out []mount
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 {
			out = append(out, mount{f[0], ovl.UnescapeMountField(f[1])})
		}
	}
	return out, nil
}

// mountPointOf returns where dev is mounted, or "".
func mountPointOf(dev string) string {
	ms, _ := readMounts()
	for _, m := range ms {
		if m.source == dev {
			return m.target
		}
	}
	return ""
}

// UnmountBeneath detaches every mount below dir, deepest first.
func UnmountBeneath(t testing.TB, dir string) {
	t.Helper()
	ms, err := readMounts()
	if err != nil {
		t.Errorf("read mounts: %v", err)
		return
	}
	var targets []string
	for _, m := range ms {
		if strings.HasPrefix(m.target, dir+"/") {
			targets = append(targets, m.target)
		}
	}
	sort.Slice(targets, func(i, j int) bool { return len(targets[i]) > len(targets[j]) })
	for _, mp := range targets {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mp, err)
		}
	}
}

// UnmountFUSEOnCleanup unmounts a FUSE server's mount at dir when the
// test ends, through the server's own unmount so that its serve loop
// ends. Cleanups run in reverse order, so an overlay on top is gone by
// then. If something still holds the mount (an overlay that could not be
// unmounted), the mount is detached so the guest goes on; the connection
// ends when the test binary exits and closes /dev/fuse, which fails any
// request still waiting. what names the mount in errors.
func UnmountFUSEOnCleanup(t testing.TB, what, dir string, unmount func() error) {
	t.Cleanup(func() {
		if err := unmount(); err != nil {
			t.Errorf("unmount %s %s: %v", what, dir, err)
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				t.Errorf("detach %s %s: %v", what, dir, err)
			}
		}
	})
}

// OverlayEntry returns the mountinfo entry of the overlay mounted at
// mountPoint, as github.com/moby/sys/mountinfo (containerd's, Docker's
// and runc's reader) parses it. The last entry for a mount point is the
// visible one.
func OverlayEntry(t testing.TB, mountPoint string) *mountinfo.Info {
	t.Helper()
	infos, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("overlay"))
	if err != nil {
		t.Fatalf("moby/sys/mountinfo GetMounts: %v", err)
	}
	var found *mountinfo.Info
	for _, info := range infos {
		if info.Mountpoint == mountPoint {
			found = info
		}
	}
	if found == nil {
		t.Fatalf("moby/sys/mountinfo lists no overlay mounted on %s (overlays it found: %d)", mountPoint, len(infos))
	}
	return found
}

// Layers is the set of directories of one overlay mount.
type Layers struct {
	Lower  []string // top first, as in lowerdir=
	Upper  string
	Work   string
	Merged string
}

// NewLayers makes lower, upper, work and merged directories under base with
// n lower layers named lower0 (top) … lowerN-1.
func NewLayers(t testing.TB, base string, n int) Layers {
	t.Helper()
	l := Layers{
		Upper:  filepath.Join(base, "upper"),
		Work:   filepath.Join(base, "work"),
		Merged: filepath.Join(base, "merged"),
	}
	for i := 0; i < n; i++ {
		l.Lower = append(l.Lower, filepath.Join(base, fmt.Sprintf("lower%d", i)))
	}
	for _, d := range append([]string{l.Upper, l.Work, l.Merged}, l.Lower...) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatalf("mkdir %s: %v", d, err)
		}
	}
	return l
}

// Options renders the overlay mount data for l followed by extra options.
func (l Layers) Options(extra ...string) string {
	opts := []string{"lowerdir=" + strings.Join(l.Lower, ":")}
	if l.Upper != "" {
		opts = append(opts, "upperdir="+l.Upper, "workdir="+l.Work)
	}
	return strings.Join(append(opts, extra...), ",")
}

// TryMount mounts the overlay and returns the mount error, unmounting at
// the end of the test when it succeeded.
func (l Layers) TryMount(t testing.TB, extra ...string) error {
	t.Helper()
	return TryMountAt(t, l.Merged, l.Options(extra...))
}

// Mount mounts the overlay or fails the test.
func (l Layers) Mount(t testing.TB, extra ...string) {
	t.Helper()
	if err := l.TryMount(t, extra...); err != nil {
		t.Fatalf("mount overlay %s: %v", l.Options(extra...), err)
	}
}

// TryMountAt mounts an overlay with the given data on target.
func TryMountAt(t testing.TB, target, data string) error {
	t.Helper()
	if err := unix.Mount("overlay", target, "overlay", 0, data); err != nil {
		return err
	}
	t.Cleanup(func() {
		// EINVAL: not mounted any more; ENOENT: the test unmounted it
		// and removed what held the mount point.
		if err := unix.Unmount(target, 0); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			if err2 := unix.Unmount(target, unix.MNT_DETACH); err2 != nil {
				t.Errorf("unmount %s: %v", target, err2)
			}
		}
	})
	return nil
}

// Unmount unmounts the overlay at l.Merged now.
func (l Layers) Unmount(t testing.TB) {
	t.Helper()
	if err := unix.Unmount(l.Merged, 0); err != nil {
		t.Fatalf("unmount %s: %v", l.Merged, err)
	}
}
