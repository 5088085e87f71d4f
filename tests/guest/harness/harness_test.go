//go:build ovlkit_guest

// Package harness checks the guest the harness boots, and carries the
// faults "ovlvm selftest" injects to prove that the harness reports them.
package harness

import (
	"os"
	"strings"
	"testing"

	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// TestGuestEnvironment checks what every other guest suite relies on.
func TestGuestEnvironment(t *testing.T) {
	if os.Getenv("OVLKIT_GUEST") != "1" {
		t.Fatal("OVLKIT_GUEST is not set: the kernel command line did not reach the tests")
	}
	if os.Geteuid() != 0 {
		t.Fatalf("running as uid %d, want root", os.Geteuid())
	}
	fss, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"overlay", "tmpfs", "ext4", "xfs", "btrfs", "tracefs"} {
		if !strings.Contains(string(fss), "\t"+want+"\n") {
			t.Errorf("kernel lacks filesystem %s", want)
		}
	}
	if _, err := os.Stat("/sys/kernel/tracing/events"); err != nil {
		t.Errorf("tracefs not mounted: %v", err)
	}
	var names []string
	for _, fs := range guesttest.Filesystems() {
		names = append(names, fs.Name)
		if fs.Name == "tmpfs" {
			continue
		}
		dir := fs.Scratch(t, "")
		if err := os.WriteFile(dir+"/probe", []byte("x"), 0o644); err != nil {
			t.Errorf("%s scratch not writable: %v", fs.Name, err)
		}
	}
	t.Logf("scratch filesystems: %s", strings.Join(names, ", "))
}

// TestInjectedFailure fails on purpose when the harness self-test asks for
// it, to show a failing guest test fails the run.
func TestInjectedFailure(t *testing.T) {
	if os.Getenv("OVLKIT_INJECT") != "fail" {
		t.Skip("no fault injected (OVLKIT_INJECT=fail)")
	}
	t.Error("Injected failure requested by the harness self-test")
}

// TestInjectedWarn makes the kernel WARN through lkdtm and passes: the
// harness must still fail the run from the kernel log alone.
func TestInjectedWarn(t *testing.T) {
	if os.Getenv("OVLKIT_INJECT") != "warn" {
		t.Skip("no fault injected (OVLKIT_INJECT=warn)")
	}
	if err := os.WriteFile("/sys/kernel/debug/provoke-crash/DIRECT", []byte("WARNING\n"), 0); err != nil {
		t.Fatalf("lkdtm: %v", err)
	}
}

// TestInjectedPanic panics the kernel through lkdtm: the harness must
// report the panic and the unfinished run instead of waiting.
func TestInjectedPanic(t *testing.T) {
	if os.Getenv("OVLKIT_INJECT") != "panic" {
		t.Skip("no fault injected (OVLKIT_INJECT=panic)")
	}
	if err := os.WriteFile("/sys/kernel/debug/provoke-crash/DIRECT", []byte("PANIC\n"), 0); err != nil {
		t.Fatalf("lkdtm: %v", err)
	}
	t.Fatal("the kernel survived an lkdtm panic")
}

// TestInjectedHang never returns: the per-binary timeout must end it.
func TestInjectedHang(t *testing.T) {
	if os.Getenv("OVLKIT_INJECT") != "hang" {
		t.Skip("no fault injected (OVLKIT_INJECT=hang)")
	}
	select {}
}
