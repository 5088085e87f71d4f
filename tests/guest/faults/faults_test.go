//go:build ovlkit_guest

// Package faults fails kernel allocations inside the overlay syscalls the
// series changes, one allocation at a time (failslab through
// /proc/thread-self/fail-nth), and checks that each syscall then either
// succeeds or fails with the error it documents, leaves the overlay usable,
// and leaves nothing behind: the overlay unmounts, its sysfs directory goes
// away, and the filesystem under the upper layer unmounts without EBUSY.
//
// It needs CONFIG_FAULT_INJECTION, CONFIG_FAILSLAB and
// CONFIG_FAULT_INJECTION_DEBUG_FS (kconfig/debug.config) and fails without
// them. It is a module of its own so that the default package pattern
// (./tests/guest/...) does not reach it: only "make test-debug", which
// boots the debug kernels, passes -pkg ./tests/guest/faults.
//
// The upper layer is always a tmpfs of its own; the lower layer is on each
// filesystem in turn. An allocation failed inside a journaling upper's own
// transaction code aborts that transaction (btrfs WARNs by design, xfs
// shuts down), which tests that filesystem rather than overlayfs, and
// would break the scratch disk for every later test.
package faults

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"unsafe"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
	"golang.org/x/sys/unix"
)

// Subjects of the patches whose new error paths the proof tests take.
const (
	subjectSharedWorkdir = "ovl: do not tear down the work dir of a mounted overlay sharing it"
	subjectStrictUpper   = "ovl: add strict_upper option to fail instead of degrading"
	subjectStrayWhiteout = "ovl: hide stray whiteouts in opaque directories"
	subjectFsync         = "ovl: add fsync=auto|strict|volatile mount option"
	subjectSysfs         = "ovl: report copy-up statistics in sysfs"
)

func TestMain(m *testing.M) {
	restore, err := setupFailslab()
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		os.Exit(1)
	}
	code := m.Run()
	restore()
	os.Exit(code)
}

// stack is one overlay with its upper layer on a tmpfs of its own.
type stack struct {
	guesttest.Layers
	upperFS string // mount point of the upper's tmpfs
}

// newStack makes lower0 on lowerBase (populated by fill) and upper, work
// and merged on a new tmpfs mounted inside a tmpfs scratch dir.
func newStack(t *testing.T, lowerBase string, fill func(lower string)) stack {
	t.Helper()
	outer := guesttest.FS{Name: "tmpfs"}.Scratch(t, "")
	upperFS := filepath.Join(outer, "upperfs")
	if err := os.Mkdir(upperFS, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", upperFS, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatalf("mount upper tmpfs: %v", err)
	}
	l := guesttest.NewLayers(t, upperFS, 0)
	l.Lower = []string{filepath.Join(lowerBase, "lower0")}
	if err := os.MkdirAll(l.Lower[0], 0o755); err != nil {
		t.Fatal(err)
	}
	if fill != nil {
		fill(l.Lower[0])
	}
	return stack{Layers: l, upperFS: upperFS}
}

// releaseUpperFS unmounts the upper's tmpfs without MNT_DETACH: a mount or
// dentry reference an overlay leaked to its upper layer makes this EBUSY.
func (s stack) releaseUpperFS(t *testing.T) {
	t.Helper()
	if err := unix.Unmount(s.upperFS, 0); err != nil {
		t.Errorf("unmount the upper layer's tmpfs after the overlays are gone: %v (a leaked reference?)", err)
	}
}

// mountCall prepares mount(2) of an overlay with the given data, converted
// before the failure is armed.
func mountCall(t *testing.T, target, data string) func() error {
	src, _ := unix.BytePtrFromString("overlay")
	tgt, _ := unix.BytePtrFromString(target)
	typ, _ := unix.BytePtrFromString("overlay")
	dat, err := unix.BytePtrFromString(data)
	if err != nil {
		t.Fatalf("mount data %q: %v", data, err)
	}
	return func() error {
		_, _, e := unix.Syscall6(unix.SYS_MOUNT, uintptr(unsafe.Pointer(src)), uintptr(unsafe.Pointer(tgt)),
			uintptr(unsafe.Pointer(typ)), unix.MS_NOATIME, uintptr(unsafe.Pointer(dat)), 0)
		return errno(e)
	}
}

// overlayDev returns the st_dev of the overlay mounted at dir as maj:min.
func overlayDev(t *testing.T, dir string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatalf("stat %s: %v", dir, err)
	}
	return fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
}

func isOverlay(dir string) bool {
	var sfs unix.Statfs_t
	return unix.Statfs(dir, &sfs) == nil && sfs.Type == unix.OVERLAYFS_SUPER_MAGIC
}

// unmount unmounts the overlay at dir, which must succeed without
// MNT_DETACH: nothing in these tests keeps a file open on it.
func unmount(t *testing.T, dir string) {
	t.Helper()
	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatalf("unmount overlay %s: %v", dir, err)
	}
	if isOverlay(dir) {
		t.Fatalf("%s is still an overlay after unmount", dir)
	}
}

// readBack checks that the lower file "f" reads through the overlay.
func readBack(t *testing.T, merged string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(merged, "f"))
	if err != nil || string(b) != "lower data" {
		t.Errorf("read f through the overlay: %q, %v", b, err)
	}
}

// mountHooks are what a mount sweep does around each attempt: before runs
// before the failure is armed, check on every mount that succeeded before
// it is unmounted, after at the end of every attempt.
type mountHooks struct {
	before func(n int)
	check  func(n int, fired bool)
	after  func(n int)
}

// mountSweep fails each allocation of an overlay mount with extra options
// in turn. The mount may fail with ENOMEM, with ENOSPC (tmpfs reports a
// failed inode allocation so, and a probe's ENOSPC may fail the mount), or
// with one of ok.
func mountSweep(t *testing.T, s stack, extra []string, ok []unix.Errno, h mountHooks) int {
	t.Helper()
	data := s.Options(extra...)
	allowed := append([]unix.Errno{unix.ENOMEM, unix.ENOSPC}, ok...)
	n := sweep(t, step{
		prepare: func(n int) func() error {
			if h.before != nil {
				h.before(n)
			}
			return mountCall(t, s.Merged, data)
		},
		judge: func(n int, err error, fired bool) {
			switch {
			case err == nil:
				if h.check != nil {
					h.check(n, fired)
				}
				unmount(t, s.Merged)
			case !fired:
				t.Fatalf("mount %s failed with no allocation failed: %v", data, err)
			case !isAny(err, allowed...):
				t.Fatalf("mount with allocation %d failed: %v, want success or one of %v", n, err, allowed)
			case isOverlay(s.Merged):
				t.Fatalf("mount with allocation %d failed (%v) but left an overlay mounted", n, err)
			}
			if h.after != nil && !t.Failed() {
				h.after(n)
			}
		},
	})
	t.Logf("mount -o %s: failed each of its %d slab allocations once", strings.Join(extra, ","), n)
	return n
}

// TestMountAllocationFailure fails each allocation of a first overlay
// mount on a work dir: the mount either works or fails with ENOMEM, and
// nothing of it stays behind.
func TestMountAllocationFailure(t *testing.T) {
	guesttest.Keeps(t, "an overlay mount whose allocation fails returns ENOMEM or ENOSPC or mounts, and leaks no reference")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		s := newStack(t, fs.Scratch(t, ""), func(lower string) { guestfs.WriteFile(t, filepath.Join(lower, "f"), "lower data") })
		mountSweep(t, s, nil, nil, mountHooks{check: func(int, bool) { readBack(t, s.Merged) }})
		// The plain mount afterwards works in full.
		s.Mount(t)
		guestfs.WriteFile(t, filepath.Join(s.Merged, "new"), "x")
		readBack(t, s.Merged)
		unmount(t, s.Merged)
		s.releaseUpperFS(t)
	})
}

// sysfsEntries lists /sys/fs/overlay (empty when it does not exist).
func sysfsEntries() map[string]bool {
	out := map[string]bool{}
	es, _ := os.ReadDir("/sys/fs/overlay")
	for _, e := range es {
		if e.IsDir() {
			out[e.Name()] = true
		}
	}
	return out
}

// TestMountAllocationFailureSysfs fails each allocation of a mount and
// checks the overlay's sysfs directory: there while mounted, gone after
// the unmount, never left behind by a failed mount.
func TestMountAllocationFailureSysfs(t *testing.T) {
	guesttest.Proves(t, subjectSysfs)
	s := newStack(t, guesttest.FS{Name: "tmpfs"}.Scratch(t, ""), func(lower string) {
		guestfs.WriteFile(t, filepath.Join(lower, "f"), "lower data")
	})
	before := sysfsEntries()
	kmsg := guesttest.OpenKmsg(t)
	n := sweep(t, step{
		prepare: func(int) func() error {
			kmsg.Lines(t) // only this attempt's messages count
			return mountCall(t, s.Merged, s.Options())
		},
		judge: func(n int, err error, fired bool) {
			if err != nil {
				if !fired || !isAny(err, unix.ENOMEM, unix.ENOSPC) {
					t.Fatalf("mount with allocation %d failed (fired %v): %v, want ENOMEM or ENOSPC", n, fired, err)
				}
			} else {
				// The statistics are not worth failing a mount for: a
				// mount whose sysfs directory could not be made says
				// so in the kernel log and goes on without it.
				dir := "/sys/fs/overlay/" + overlayDev(t, s.Merged)
				if _, err := os.Stat(dir + "/copy_up"); err != nil && !kmsg.Contains(t, "failed to add sysfs statistics") {
					t.Fatalf("mount with allocation %d failed once succeeded without its sysfs directory and without a warning: %v", n, err)
				}
				unmount(t, s.Merged)
				if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("%s still there after the unmount (allocation %d failed): %v", dir, n, err)
				}
			}
			if after := sysfsEntries(); len(after) != len(before) {
				t.Fatalf("/sys/fs/overlay had %d entries before the mount and has %d after it and its unmount (allocation %d failed)",
					len(before), len(after), n)
			}
		},
	})
	t.Logf("failed each of the mount's %d slab allocations once", n)
	s.releaseUpperFS(t)
}

// TestJoinAllocationFailure fails each allocation of a second mount that
// joins a mounted overlay's work dir (index=off). The first mount keeps
// working after every attempt: unlink of a lower file needs a whiteout
// staged in the shared work dir. The work dir holds an incompat directory
// with a dot entry, which the joining mount reads and ignores.
func TestJoinAllocationFailure(t *testing.T) {
	guesttest.Proves(t, subjectSharedWorkdir)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		const files = 1000
		s := newStack(t, fs.Scratch(t, ""), func(lower string) {
			guestfs.WriteFile(t, filepath.Join(lower, "f"), "lower data")
			for i := 0; i < files; i++ {
				guestfs.WriteFile(t, filepath.Join(lower, fmt.Sprintf("u%d", i)), "")
			}
		})
		a := s.Layers
		a.Merged = filepath.Join(s.upperFS, "merged-a")
		if err := os.Mkdir(a.Merged, 0o755); err != nil {
			t.Fatal(err)
		}
		a.Mount(t, "index=off")
		incompat := filepath.Join(s.Work, "work", "incompat")
		if err := os.MkdirAll(filepath.Join(incompat, ".ovlkit-keep"), 0o755); err != nil {
			t.Fatal(err)
		}
		mountSweep(t, s, []string{"index=off"}, nil, mountHooks{
			before: func(n int) {
				if n > files {
					t.Fatalf("join sweep needs more than %d lower files", files)
				}
			},
			check: func(int, bool) { readBack(t, s.Merged) },
			// The first mount still works: unlink of a lower file
			// stages a whiteout in the shared work dir.
			after: func(n int) {
				if err := os.Remove(filepath.Join(a.Merged, fmt.Sprintf("u%d", n-1))); err != nil {
					t.Fatalf("unlink a lower file in the first mount after the join with allocation %d failed: %v", n, err)
				}
			},
		})
		unmount(t, a.Merged)
		s.releaseUpperFS(t)
	})
}

// TestStrictUpperAllocationFailure fails each allocation of a strict_upper
// mount: it fails (ENOMEM, or EINVAL when a failed probe makes a feature
// look missing) or mounts with every feature, read-write, never degraded.
func TestStrictUpperAllocationFailure(t *testing.T) {
	guesttest.Proves(t, subjectStrictUpper)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		s := newStack(t, fs.Scratch(t, ""), func(lower string) {
			guestfs.WriteFile(t, filepath.Join(lower, "f"), "lower data")
			guestfs.WriteFile(t, filepath.Join(lower, "g"), "")
		})
		kmsg := guesttest.OpenKmsg(t)
		// EEXIST: an attempt whose allocation failed while removing
		// the work dir an earlier attempt left behind leaves it there,
		// and strict_upper fails the mount with mkdir's error where a
		// mount without it goes read-only.
		mountSweep(t, s, []string{"strict_upper"}, []unix.Errno{unix.EINVAL, unix.EEXIST}, mountHooks{
			// Only this attempt's messages count.
			before: func(int) { kmsg.Lines(t) },
			check: func(n int, fired bool) {
				for _, l := range kmsg.Lines(t) {
					if strings.Contains(l, "mounting read-only") || strings.Contains(l, "does not support") ||
						strings.Contains(l, "falling back to index=off") {
						t.Errorf("strict_upper mount with allocation %d failed degraded instead of failing: %s", n, l)
					}
				}
				var sfs unix.Statfs_t
				if err := unix.Statfs(s.Merged, &sfs); err != nil || sfs.Flags&unix.ST_RDONLY != 0 {
					t.Errorf("strict_upper mount with allocation %d failed is read-only (%v)", n, err)
				}
				readBack(t, s.Merged)
				// A whiteout and a copy-up work.
				if err := os.Remove(filepath.Join(s.Merged, "g")); err != nil {
					t.Errorf("unlink a lower file in the strict_upper mount: %v", err)
				}
				if err := os.WriteFile(filepath.Join(s.Merged, "f"), []byte("lower data"), 0o644); err != nil {
					t.Errorf("copy up in the strict_upper mount: %v", err)
				}
			},
			// Undo the upper changes (the overlay is unmounted now).
			after: func(int) {
				for _, p := range []string{"g", "f"} {
					if err := os.Remove(filepath.Join(s.Upper, p)); err != nil && !errors.Is(err, os.ErrNotExist) {
						t.Fatal(err)
					}
				}
			},
		})
		s.releaseUpperFS(t)
	})
}

// copyUpSweep fails each allocation of opening a lower file for write (a
// copy-up) in the overlay mounted with extra options. Each attempt uses a
// lower file no attempt copied up yet; after a failed attempt the same
// open works and the file has its lower content.
func copyUpSweep(t *testing.T, fs guesttest.FS, extra ...string) {
	t.Helper()
	const files = 400
	s := newStack(t, fs.Scratch(t, ""), func(lower string) {
		for i := 0; i < files; i++ {
			guestfs.WriteFile(t, filepath.Join(lower, fmt.Sprintf("c%d", i)), fmt.Sprintf("lower %d", i))
		}
	})
	s.Mount(t, extra...)
	var fd int
	n := sweep(t, step{
		prepare: func(n int) func() error {
			if n > files {
				t.Fatalf("copy-up sweep needs more than %d lower files", files)
			}
			p, _ := unix.BytePtrFromString(filepath.Join(s.Merged, fmt.Sprintf("c%d", n-1)))
			return func() error {
				r, _, e := unix.Syscall(unix.SYS_OPEN, uintptr(unsafe.Pointer(p)), unix.O_WRONLY|unix.O_CLOEXEC, 0)
				fd = int(r)
				return errno(e)
			}
		},
		judge: func(n int, err error, fired bool) {
			name := filepath.Join(s.Merged, fmt.Sprintf("c%d", n-1))
			switch {
			case err == nil:
				unix.Close(fd)
			case !fired || !isAny(err, unix.ENOMEM, unix.ENOSPC):
				// ENOSPC: tmpfs reports a failed inode allocation so.
				t.Fatalf("open for write (copy-up) with allocation %d failed (fired %v): %v, want ENOMEM or ENOSPC", n, fired, err)
			default:
				f, err := os.OpenFile(name, os.O_WRONLY, 0)
				if err != nil {
					t.Fatalf("open for write after the failed copy-up: %v", err)
				}
				f.Close()
			}
			b, err := os.ReadFile(name)
			if want := fmt.Sprintf("lower %d", n-1); err != nil || string(b) != want {
				t.Fatalf("after the copy-up with allocation %d failed the file reads %q, %v; want %q", n, b, err, want)
			}
		},
	})
	t.Logf("copy-up (-o %s): failed each of its %d slab allocations once", strings.Join(extra, ","), n)
	unmount(t, s.Merged)
	s.releaseUpperFS(t)
}

// TestCopyUpAllocationFailure fails each allocation of a copy-up.
func TestCopyUpAllocationFailure(t *testing.T) {
	guesttest.Keeps(t, "a copy-up whose allocation fails returns ENOMEM or ENOSPC and a retry copies up the lower content")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) { copyUpSweep(t, fs) })
}

// TestFsyncStrictAllocationFailure fails each allocation of an fsync=strict
// mount, then of a copy-up in such a mount (which syncs the copy).
func TestFsyncStrictAllocationFailure(t *testing.T) {
	guesttest.Proves(t, subjectFsync)
	tmpfs := guesttest.FS{Name: "tmpfs"}
	t.Run("mount", func(t *testing.T) {
		s := newStack(t, tmpfs.Scratch(t, ""), func(lower string) { guestfs.WriteFile(t, filepath.Join(lower, "f"), "lower data") })
		mountSweep(t, s, []string{"fsync=strict"}, nil, mountHooks{check: func(int, bool) { readBack(t, s.Merged) }})
		s.releaseUpperFS(t)
	})
	t.Run("copy-up", func(t *testing.T) { copyUpSweep(t, tmpfs, "fsync=strict") })
}

// getdentsNames reads one directory fd to its end and returns the names.
func getdentsNames(t *testing.T, fd int) []string {
	t.Helper()
	var names []string
	buf := make([]byte, 8192)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			t.Fatalf("getdents: %v", err)
		}
		if n == 0 {
			break
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
	sort.Strings(names)
	return names
}

// TestReaddirAllocationFailure fails each allocation of the first getdents
// of a directory read straight from its real directory and holding a
// character device that is no whiteout, a whiteout and a file: the lower
// directory of a lower-only dir, and an opaque upper dir. The call lists
// the device and the file and hides the whiteout, or fails with ENOMEM;
// after ENOMEM a new read lists the same.
func TestReaddirAllocationFailure(t *testing.T) {
	guesttest.Proves(t, subjectStrayWhiteout)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		populate := func(dir string) {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mknod(filepath.Join(dir, "dev"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mknod(filepath.Join(dir, "wh"), unix.S_IFCHR, int(unix.Mkdev(0, 0))); err != nil {
				t.Fatal(err)
			}
			guestfs.WriteFile(t, filepath.Join(dir, "file"), "")
		}
		s := newStack(t, fs.Scratch(t, ""), func(lower string) {
			populate(filepath.Join(lower, "lowerdir"))
			// The lower side of the opaque dir, which it hides.
			if err := os.Mkdir(filepath.Join(lower, "opaque"), 0o755); err != nil {
				t.Fatal(err)
			}
			guestfs.WriteFile(t, filepath.Join(lower, "opaque", "hidden"), "")
		})
		populate(filepath.Join(s.Upper, "opaque"))
		if err := unix.Setxattr(filepath.Join(s.Upper, "opaque"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
			t.Fatal(err)
		}
		s.Mount(t)
		want := "dev, file" // unix.ParseDirent leaves out . and ..
		for _, dir := range []string{"lowerdir", "opaque"} {
			path := filepath.Join(s.Merged, dir)
			var fd int
			buf := make([]byte, 8192)
			n := sweep(t, step{
				prepare: func(int) func() error {
					var err error
					fd, err = unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
					if err != nil {
						t.Fatalf("open %s: %v", path, err)
					}
					return func() error {
						_, _, e := unix.Syscall(unix.SYS_GETDENTS64, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
						return errno(e)
					}
				},
				judge: func(n int, err error, fired bool) {
					defer unix.Close(fd)
					var names []string
					switch {
					case err == nil:
						// Read it again in full: the first call may not
						// hold every entry.
						if _, err := unix.Seek(fd, 0, 0); err != nil {
							t.Fatalf("rewind %s: %v", dir, err)
						}
						names = getdentsNames(t, fd)
					case !fired || !errors.Is(err, unix.ENOMEM):
						t.Fatalf("getdents of %s with allocation %d failed (fired %v): %v, want ENOMEM", dir, n, fired, err)
					default:
						// A new read lists the same. Not the same file: where
						// its position stands after the failed call is the
						// real filesystem's (ext4's hashed readdir leaves it
						// at the end, on stock kernels too).
						fd2, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
						if err != nil {
							t.Fatalf("open %s again: %v", path, err)
						}
						names = getdentsNames(t, fd2)
						unix.Close(fd2)
					}
					sort.Strings(names)
					if g := strings.Join(names, ", "); g != want {
						t.Fatalf("%s lists %s with allocation %d failed, want %s", dir, g, n, want)
					}
				},
			})
			t.Logf("getdents of %s: failed each of its %d slab allocations once", dir, n)
		}
		unmount(t, s.Merged)
		s.releaseUpperFS(t)
	})
}

// TestRmdirAllocationFailure fails each allocation of rmdir of an opaque
// upper directory that holds a stray whiteout: it succeeds or fails with
// ENOMEM (or ENOTEMPTY, see below), and after a failure a plain rmdir of
// the same directory succeeds.
func TestRmdirAllocationFailure(t *testing.T) {
	guesttest.Proves(t, subjectStrayWhiteout)
	const dirs = 300
	s := newStack(t, guesttest.FS{Name: "tmpfs"}.Scratch(t, ""), nil)
	for i := 0; i < dirs; i++ {
		d := filepath.Join(s.Upper, fmt.Sprintf("o%d", i))
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Setxattr(d, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(filepath.Join(d, "stray"), unix.S_IFCHR, int(unix.Mkdev(0, 0))); err != nil {
			t.Fatal(err)
		}
	}
	s.Mount(t)
	n := sweep(t, step{
		prepare: func(n int) func() error {
			if n > dirs {
				t.Fatalf("rmdir sweep needs more than %d directories", dirs)
			}
			p, _ := unix.BytePtrFromString(filepath.Join(s.Merged, fmt.Sprintf("o%d", n-1)))
			return func() error {
				_, _, e := unix.Syscall(unix.SYS_RMDIR, uintptr(unsafe.Pointer(p)), 0, 0)
				return errno(e)
			}
		},
		judge: func(n int, err error, fired bool) {
			name := filepath.Join(s.Merged, fmt.Sprintf("o%d", n-1))
			// ENOTEMPTY too: the emptiness check looks each character
			// device up to tell a whiteout, and takes one whose lookup
			// failed for an entry, as overlayfs does for every merge
			// directory on stock kernels. The retry below shows that
			// nothing is left behind. ENOSPC: the tmpfs upper's answer
			// to a failed inode allocation (clearing the directory makes
			// one in the work dir).
			switch {
			case err == nil:
			case !fired || !isAny(err, unix.ENOMEM, unix.ENOTEMPTY, unix.ENOSPC):
				t.Fatalf("rmdir of an opaque dir holding a whiteout, allocation %d failed (fired %v): %v, want success, ENOMEM, ENOTEMPTY or ENOSPC", n, fired, err)
			default:
				if err := unix.Rmdir(name); err != nil {
					t.Fatalf("rmdir after the rmdir with allocation %d failed: %v", n, err)
				}
			}
			if _, err := os.Lstat(name); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("%s still there after rmdir (allocation %d failed): %v", name, n, err)
			}
		},
	})
	t.Logf("rmdir: failed each of its %d slab allocations once", n)
	unmount(t, s.Merged)
	s.releaseUpperFS(t)
}
