package ovl

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Mounter mounts overlays. The zero value uses the legacy mount(2) data;
// LowerdirPlus selects fsopen/fsconfig with one "lowerdir+" per layer,
// which the kernel accepts from 6.8 on and which has no page limit.
type Mounter struct {
	// LowerdirPlus: the kernel accepts fsconfig "lowerdir+" (probed).
	LowerdirPlus bool
	// PageSize is the mount data limit; zero means the system page size.
	PageSize int
}

// Method names how Mount will mount c: "fsconfig", "absolute" or
// "relative", or an error when it cannot.
func (m Mounter) Method(c Config) (string, error) {
	if err := c.Validate(); err != nil {
		return "", err
	}
	if m.LowerdirPlus {
		return "fsconfig", nil
	}
	p, err := c.LegacyPlan(m.pageSize())
	if err != nil {
		return "", err
	}
	if p.Dir != "" {
		return "relative", nil
	}
	return "absolute", nil
}

func (m Mounter) pageSize() int {
	if m.PageSize > 0 {
		return m.PageSize
	}
	return os.Getpagesize()
}

// flags are the mount(2) flags of c: MS_RDONLY for readOnly, and
// MS_NOSUID and MS_NODEV as c asks.
func (c Config) flags(readOnly bool) uintptr {
	return uintptr(c.bits(readOnly, unix.MS_RDONLY, unix.MS_NOSUID, unix.MS_NODEV))
}

// attrs are the same flags as fsmount(2) attributes.
func (c Config) attrs(readOnly bool) int {
	return int(c.bits(readOnly, unix.MOUNT_ATTR_RDONLY, unix.MOUNT_ATTR_NOSUID, unix.MOUNT_ATTR_NODEV))
}

// bits ORs the bits, in one of the two APIs' spellings, of what c asks
// for: read-only, no setuid, no devices.
func (c Config) bits(readOnly bool, rdonly, nosuid, nodev uint64) uint64 {
	var b uint64
	for _, f := range []struct {
		on  bool
		bit uint64
	}{{readOnly, rdonly}, {c.NoSuid, nosuid}, {c.NoDev, nodev}} {
		if f.on {
			b |= f.bit
		}
	}
	return b
}

// Mount mounts the overlay c on target. readOnly adds MS_RDONLY;
// c.NoSuid and c.NoDev add MS_NOSUID and MS_NODEV.
func (m Mounter) Mount(target string, c Config, readOnly bool) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if m.LowerdirPlus {
		return mountFsconfig(target, c, readOnly)
	}
	p, err := c.LegacyPlan(m.pageSize())
	if err != nil {
		return err
	}
	flags := c.flags(readOnly)
	if p.Dir == "" {
		if err := unix.Mount("overlay", target, "overlay", flags, p.Data); err != nil {
			return fmt.Errorf("mount overlay on %s: %w", target, err)
		}
		return nil
	}
	return mountFrom(p.Dir, target, flags, p.Data)
}

// mountFrom mounts with relative layer paths from dir. The working
// directory is per process, so the mount runs on a dedicated OS thread
// that first unshares its filesystem context; the thread stays locked and
// is discarded when the goroutine ends, so no other goroutine ever runs
// with the changed directory.
func mountFrom(dir, target string, flags uintptr, data string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the runtime terminates the thread.
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("unshare filesystem context: %w", err)
			return
		}
		if err := unix.Chdir(dir); err != nil {
			errc <- fmt.Errorf("chdir %s: %w", dir, err)
			return
		}
		if err := unix.Mount("overlay", target, "overlay", flags, data); err != nil {
			errc <- fmt.Errorf("mount overlay on %s from %s: %w", target, dir, err)
			return
		}
		errc <- nil
	}()
	return <-errc
}

// mountFsconfig builds the mount with the new mount API, one layer per
// fsconfig call, and attaches it at target.
func mountFsconfig(target string, c Config, readOnly bool) (err error) {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fd)
	defer func() {
		if err != nil {
			if log := fsLog(fd); log != "" {
				err = fmt.Errorf("%w (kernel: %s)", err, log)
			}
		}
	}()
	for _, l := range c.Lower {
		if err := unix.FsconfigSetString(fd, "lowerdir+", l); err != nil {
			return fmt.Errorf("fsconfig lowerdir+ %s: %w", l, err)
		}
	}
	if c.Upper != "" {
		if err := unix.FsconfigSetString(fd, "upperdir", c.Upper); err != nil {
			return fmt.Errorf("fsconfig upperdir %s: %w", c.Upper, err)
		}
		if err := unix.FsconfigSetString(fd, "workdir", c.Work); err != nil {
			return fmt.Errorf("fsconfig workdir %s: %w", c.Work, err)
		}
	}
	for _, o := range c.Options {
		k, v, hasValue := strings.Cut(o, "=")
		if hasValue {
			err = unix.FsconfigSetString(fd, k, v)
		} else {
			err = unix.FsconfigSetFlag(fd, k)
		}
		if err != nil {
			return fmt.Errorf("fsconfig %s: %w", o, err)
		}
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return fmt.Errorf("fsconfig create overlay: %w", err)
	}
	mfd, err := unix.Fsmount(fd, unix.FSMOUNT_CLOEXEC, c.attrs(readOnly))
	if err != nil {
		return fmt.Errorf("fsmount overlay: %w", err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount overlay to %s: %w", target, err)
	}
	return nil
}

// fsLog drains the messages the kernel attached to an fs context, which
// name the option it refused.
func fsLog(fd int) string {
	var msgs []string
	buf := make([]byte, 1024)
	for {
		n, err := unix.Read(fd, buf)
		if err != nil || n <= 0 {
			break
		}
		msgs = append(msgs, strings.TrimSpace(string(buf[:n])))
	}
	return strings.Join(msgs, "; ")
}

// Unmount unmounts target. detach uses MNT_DETACH, which also drops the
// copies of the mount that other mount namespaces hold (moby #34672).
func Unmount(target string, detach bool) error {
	var flags int
	if detach {
		flags = unix.MNT_DETACH
	}
	if err := unix.Unmount(target, flags); err != nil {
		return fmt.Errorf("unmount %s: %w", target, err)
	}
	return nil
}

// overlayMagic is OVERLAYFS_SUPER_MAGIC.
const overlayMagic = 0x794c7630

// IsOverlay reports whether path is the root of, or inside, an overlay
// mount. It is how a reference count is checked against the kernel after
// a crash.
func IsOverlay(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("statfs %s: %w", path, err)
	}
	return st.Type == overlayMagic, nil
}
