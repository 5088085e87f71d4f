package vm

import (
	"reflect"
	"strings"
	"testing"
)

func TestKernelArgs(t *testing.T) {
	c := Config{Accel: KVM, Env: map[string]string{"OVLKIT_RUN": "TestA", "A": "1"}}
	got, err := c.kernelArgs()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"console=ttyS0", "panic=-1", "oops=panic", "printk.devkmsg=on",
		"tsc=reliable", "OVLKIT_GUEST=1", "A=1", "OVLKIT_RUN=TestA"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("kernel command line\n%q\nwant\n%q", got, want)
	}
	c.Env["B"] = "two words"
	if _, err := c.kernelArgs(); err == nil || !strings.Contains(err.Error(), "B=") {
		t.Errorf("a value with a space: err %v, want one naming B", err)
	}
}

func TestQEMUArgs(t *testing.T) {
	c := Config{Accel: TCG, MemoryMB: 768, Filesystems: []string{"xfs", "vfat"}}
	got := strings.Join(c.qemuArgs(map[string]string{"xfs": "/w/xfs.img", "vfat": "/w/vfat.img"}, "/w/results.txt",
		"-device", "extra"), " ")
	want := "-drive file=/w/xfs.img,if=none,id=disk0,format=raw,cache=unsafe " +
		"-device virtio-blk-pci,drive=disk0,serial=ovlkit-xfs " +
		"-drive file=/w/vfat.img,if=none,id=disk1,format=raw,cache=unsafe " +
		"-device virtio-blk-pci,drive=disk1,serial=ovlunfit-vfat " +
		"-m 768 -no-reboot -device virtio-serial-pci " +
		"-chardev file,id=results,path=/w/results.txt -device virtconsole,chardev=results " +
		"-device extra -accel tcg"
	if got != want {
		t.Errorf("QEMU arguments\n%s\nwant\n%s", got, want)
	}
}

func TestXfstestsQEMUArgs(t *testing.T) {
	c := XfstestsConfig{Kernel: "/k/bzImage", Image: "/c/root.img", Accel: KVM, MemoryMB: 2048}
	got := strings.Join(c.qemuArgs(xfstestsDisks{test: "/w/t.img", scratch: "/w/s.img", control: "/w/c.img"}), " ")
	want := "-nodefaults -display none -serial stdio -no-reboot -m 2048 -kernel /k/bzImage " +
		"-append console=ttyS0 root=/dev/vda rw rootfstype=ext4 init=/sbin/ovlkit-xfstests-init panic=-1 printk.devkmsg=on tsc=reliable " +
		// The root disk first, so that it is vda, and never written.
		"-drive file=/c/root.img,if=none,id=root,format=raw,snapshot=on,cache=unsafe -device virtio-blk-pci,drive=root,serial=ovlkit-root " +
		"-drive file=/w/t.img,if=none,id=xtest,format=raw,cache=unsafe -device virtio-blk-pci,drive=xtest,serial=ovlkit-xfstest " +
		"-drive file=/w/s.img,if=none,id=xscratch,format=raw,cache=unsafe -device virtio-blk-pci,drive=xscratch,serial=ovlkit-xfscratch " +
		"-drive file=/w/c.img,if=none,id=xctl,format=raw,cache=unsafe -device virtio-blk-pci,drive=xctl,serial=ovlkit-control " +
		"-accel kvm -cpu host"
	if got != want {
		t.Errorf("QEMU arguments\n%s\nwant\n%s", got, want)
	}
}
