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
