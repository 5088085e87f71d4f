package vm

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hugelgupf/vmtest/qemu"
)

// qemuArgs are the QEMU arguments of a guest of c beyond the kernel, the
// initramfs and the serial console: the disks (images by filesystem, in
// the order of c.Filesystems), the memory, no reboot (a reboot or a panic
// ends the VM), the results console that writes to resultsPath, and the
// accelerator. extra comes before the accelerator's arguments.
func (c *Config) qemuArgs(disks map[string]string, resultsPath string, extra ...string) []string {
	var args []string
	for i, fs := range c.Filesystems {
		args = append(args, diskArgs(i, fs, disks[fs])...)
	}
	args = append(args,
		"-m", fmt.Sprint(c.MemoryMB),
		"-no-reboot",
		"-device", "virtio-serial-pci",
		"-chardev", "file,id=results,path="+resultsPath,
		"-device", "virtconsole,chardev=results",
	)
	args = append(args, extra...)
	return append(args, c.Accel.qemuArgs()...)
}

// A machine is a booted guest: QEMU, and its serial console collected,
// logged and passed on.
type machine struct {
	vm    *qemu.VM
	lines *lineCollector
	log   *os.File
	pw    *io.PipeWriter
	wg    sync.WaitGroup
	start time.Time
}

// startMachine boots c.Kernel with initrd and the QEMU arguments qargs; the
// serial console goes to serialPath and to c.Console. progress, when set,
// receives the guest init's announcements.
func (c *Config) startMachine(ctx context.Context, initrd, serialPath string, qargs []string, progress func(string, ...any)) (*machine, error) {
	kargs, err := c.kernelArgs()
	if err != nil {
		return nil, err
	}
	log, err := os.Create(serialPath)
	if err != nil {
		return nil, err
	}
	m := &machine{lines: &lineCollector{progress: progress, start: time.Now()}, log: log, start: time.Now()}
	pr, pw := io.Pipe()
	m.pw = pw
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.lines.consume(pr, log, c.Console)
	}()
	m.vm, err = qemu.StartContext(ctx, qemu.ArchAMD64,
		qemu.WithQEMUCommand(c.QEMU),
		qemu.WithKernel(c.Kernel),
		qemu.WithInitramfs(initrd),
		qemu.WithAppendKernel(kargs...),
		qemu.ArbitraryArgs(qargs...),
		qemu.WithVMTimeout(c.Timeout),
		qemu.WithSerialOutput(pw),
	)
	if err != nil {
		pw.Close()
		m.wg.Wait()
		log.Close()
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	return m, nil
}

// wait waits for QEMU to end and the console to be read to its end, and
// returns the guest's wall time and QEMU's exit error.
func (m *machine) wait() (float64, error) {
	err := m.vm.Wait()
	m.pw.Close()
	m.wg.Wait()
	m.log.Close()
	return time.Since(m.start).Seconds(), err
}

// console is the serial console read so far.
func (m *machine) console() []string { return m.lines.all() }

// makeDisks creates a fresh image for each of c.Filesystems in c.WorkDir.
func (c *Config) makeDisks(ctx context.Context) (map[string]string, error) {
	disks := map[string]string{}
	for _, fs := range c.Filesystems {
		img, err := makeDisk(ctx, c.WorkDir, fs)
		if err != nil {
			removeDisks(disks)
			return nil, err
		}
		disks[fs] = img
	}
	return disks, nil
}

func removeDisks(disks map[string]string) {
	for _, img := range disks {
		os.Remove(img)
	}
}

// resultsFile is where a boot's results console writes, removed first so
// that a guest that never writes leaves none.
func resultsFile(dir, name string) string {
	p := filepath.Join(dir, name)
	_ = os.Remove(p)
	return p
}
