//go:build ovlkit_guest

package crash

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The devices of a run are loop devices over sparse files on a tmpfs: the
// base image of a filesystem (read once from the disk the harness
// formatted), the data device the workload's filesystem lives on, the
// log device of dm-log-writes, and the replay images. A tmpfs file can be
// copied sparsely in a fraction of a second, which is what makes a fresh,
// writable copy of the replayed disk per replay point affordable under
// TCG; the guest has no mkfs, hence the harness's disks.

// loopDev is an attached loop device.
type loopDev struct {
	Path string
	Dev  uint64 // dev_t
}

// attachLoop attaches file to a free loop device, detached when the test
// ends (or earlier by detach).
func attachLoop(t testing.TB, file string) loopDev {
	t.Helper()
	l, err := tryAttachLoop(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.detach() })
	return l
}

func tryAttachLoop(file string) (loopDev, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return loopDev{}, fmt.Errorf("open loop-control: %w", err)
	}
	defer ctl.Close()
	n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
	if err != nil {
		return loopDev{}, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
	}
	path := fmt.Sprintf("/dev/loop%d", n)
	dev, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return loopDev{}, fmt.Errorf("open %s: %w", path, err)
	}
	defer dev.Close()
	back, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		return loopDev{}, fmt.Errorf("open %s: %w", file, err)
	}
	defer back.Close()
	cfg := unix.LoopConfig{Fd: uint32(back.Fd())}
	if err := unix.IoctlLoopConfigure(int(dev.Fd()), &cfg); err != nil {
		return loopDev{}, fmt.Errorf("LOOP_CONFIGURE %s on %s: %w", file, path, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return loopDev{}, fmt.Errorf("stat %s: %w", path, err)
	}
	return loopDev{Path: path, Dev: st.Rdev}, nil
}

// detach releases the loop device; a user still holding it (a mount that
// is being torn down) makes the kernel detach it at its last close.
func (l loopDev) detach() error {
	f, err := os.OpenFile(l.Path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", l.Path, err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && err != unix.ENXIO {
		return fmt.Errorf("LOOP_CLR_FD %s: %w", l.Path, err)
	}
	return nil
}

func (l loopDev) majMin() string {
	return fmt.Sprintf("%d:%d", unix.Major(l.Dev), unix.Minor(l.Dev))
}

// dmIoctl issues a device-mapper ioctl on the device called name with
// payload (holding targets target specs) after the header, and returns
// the header the kernel answered with.
func dmIoctl(cmd uint, name string, targets uint32, payload []byte) (unix.DmIoctl, error) {
	ctl, err := os.OpenFile("/dev/mapper/control", os.O_RDWR, 0)
	if err != nil {
		return unix.DmIoctl{}, fmt.Errorf("open /dev/mapper/control (CONFIG_BLK_DEV_DM): %w", err)
	}
	defer ctl.Close()
	// Room for the kernel's answer (a status line) beyond the payload.
	buf := make([]byte, unix.SizeofDmIoctl+len(payload)+4096)
	h := (*unix.DmIoctl)(unsafe.Pointer(&buf[0]))
	h.Version = [3]uint32{4, 0, 0}
	h.Data_size = uint32(len(buf))
	h.Data_start = unix.SizeofDmIoctl
	h.Target_count = targets
	if len(name) >= len(h.Name) {
		return unix.DmIoctl{}, fmt.Errorf("device-mapper name %q too long", name)
	}
	copy(h.Name[:], name)
	copy(buf[unix.SizeofDmIoctl:], payload)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, ctl.Fd(), uintptr(cmd), uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
		return unix.DmIoctl{}, errno
	}
	return *h, nil
}

// logWrites is a dm-log-writes device.
type logWrites struct {
	Name string
	Path string // a block special file for it in the test's directory
}

// createLogWrites puts a log-writes target over data, logging to log, and
// returns the device, removed when the test ends.
func createLogWrites(t testing.TB, name, nodeDir string, data, log loopDev, sectors uint64) logWrites {
	t.Helper()
	h, err := dmIoctl(unix.DM_DEV_CREATE, name, 0, nil)
	if err != nil {
		t.Fatalf("DM_DEV_CREATE %s: %v", name, err)
	}
	lw := logWrites{Name: name, Path: filepath.Join(nodeDir, name)}
	t.Cleanup(func() {
		if err := lw.remove(); err != nil {
			t.Errorf("%v", err)
		}
	})
	params := data.majMin() + " " + log.majMin()
	spec := make([]byte, unix.SizeofDmTargetSpec)
	ts := (*unix.DmTargetSpec)(unsafe.Pointer(&spec[0]))
	ts.Sector_start = 0
	ts.Length = sectors
	copy(ts.Target_type[:], "log-writes")
	p := append([]byte(params), 0)
	for len(p)%8 != 0 {
		p = append(p, 0)
	}
	ts.Next = uint32(len(spec) + len(p))
	if _, err := dmIoctl(unix.DM_TABLE_LOAD, name, 1, append(spec, p...)); err != nil {
		t.Fatalf("DM_TABLE_LOAD %s log-writes %q: %v", name, params, err)
	}
	// DM_DEV_SUSPEND without DM_SUSPEND_FLAG resumes: the loaded table
	// becomes live.
	if _, err := dmIoctl(unix.DM_DEV_SUSPEND, name, 0, nil); err != nil {
		t.Fatalf("resume %s: %v", name, err)
	}
	// The ioctl reports the device number in the kernel's
	// huge_encode_dev form; Major and Minor decode it.
	dev := unix.Mkdev(unix.Major(h.Dev), unix.Minor(h.Dev))
	if err := unix.Mknod(lw.Path, unix.S_IFBLK|0o600, int(dev)); err != nil {
		t.Fatalf("mknod %s: %v", lw.Path, err)
	}
	return lw
}

// mark inserts a named mark into the log, in order with the writes that
// completed before it.
func (lw logWrites) mark(t testing.TB, name string) {
	t.Helper()
	msg := make([]byte, 8) // struct dm_target_msg: the sector, 0
	msg = append(msg, []byte("mark "+name)...)
	msg = append(msg, 0)
	if _, err := dmIoctl(unix.DM_TARGET_MSG, lw.Name, 0, msg); err != nil {
		t.Fatalf("mark %s on %s: %v", name, lw.Name, err)
	}
}

// remove tears the device down; the target writes the final super block
// then, so the log is complete only after this.
func (lw logWrites) remove() error {
	if _, err := dmIoctl(unix.DM_DEV_REMOVE, lw.Name, 0, nil); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("DM_DEV_REMOVE %s: %w", lw.Name, err)
	}
	os.Remove(lw.Path)
	return nil
}

// sparseFile creates a sparse file of size bytes.
func sparseFile(t testing.TB, path string, size int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatalf("truncate %s: %v", path, err)
	}
}

// imageOf copies the block device dev into a sparse file, leaving out the
// 4 KiB blocks that are all zeros (almost all of a freshly made
// filesystem), and returns its size.
func imageOf(t testing.TB, dev, path string) int64 {
	t.Helper()
	in, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	size, err := in.Seek(0, io.SeekEnd)
	if err != nil {
		t.Fatalf("size of %s: %v", dev, err)
	}
	sparseFile(t, path, size)
	out, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	buf := make([]byte, 1<<20)
	zero := make([]byte, 4096)
	for off := int64(0); off < size; {
		n, err := in.ReadAt(buf, off)
		if n == 0 && err != nil {
			t.Fatalf("read %s at %d: %v", dev, off, err)
		}
		for b := 0; b < n; b += len(zero) {
			blk := buf[b:min(b+len(zero), n)]
			if bytes.Equal(blk, zero[:len(blk)]) {
				continue
			}
			if _, err := out.WriteAt(blk, off+int64(b)); err != nil {
				t.Fatalf("write %s: %v", path, err)
			}
		}
		off += int64(n)
	}
	return size
}

// copySparse makes dst a copy of src that has holes where src has them.
func copySparse(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := out.Truncate(fi.Size()); err != nil {
		return fmt.Errorf("truncate %s: %w", dst, err)
	}
	buf := make([]byte, 1<<20)
	for off := int64(0); off < fi.Size(); {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("SEEK_DATA %s at %d: %w", src, off, err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("SEEK_HOLE %s at %d: %w", src, data, err)
		}
		for p := data; p < hole; {
			n, err := in.ReadAt(buf[:min(int64(len(buf)), hole-p)], p)
			if n == 0 {
				return fmt.Errorf("read %s at %d: %w", src, p, err)
			}
			if _, err := out.WriteAt(buf[:n], p); err != nil {
				return fmt.Errorf("write %s at %d: %w", dst, p, err)
			}
			p += int64(n)
		}
		off = hole
	}
	return nil
}

// holeFile is a replay target that punches holes for discards.
type holeFile struct{ *os.File }

func (h holeFile) Discard(off, n int64) error {
	return unix.Fallocate(int(h.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}
