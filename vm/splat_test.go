package vm

import (
	"strings"
	"testing"
)

func TestFindSplatsNamesTheRunningTest(t *testing.T) {
	log := []string{
		"[    1.0] WARNING: CPU: 0 PID: 1 at init/main.c:1 early+0x1/0x2",
		"[    1.0] ---[ end trace 0000000000000000 ]---",
		"[    2.0] ovlkit: run example/opaque TestReaddir",
		"[    2.1] ovlkit: run example/opaque TestReaddir/ext4",
		"[    2.2] BUG: KASAN: use-after-free in ovl_iterate+0x10/0x20",
		"[    2.2] ==================================================================",
		"[    3.0] ovlkit: run example/faults TestMount/xfs",
		"[    3.1] WARNING: possible circular locking dependency detected",
	}
	s := FindSplats(log)
	if len(s) != 3 {
		t.Fatalf("got %d splats, want 3: %+v", len(s), s)
	}
	for i, want := range []string{"", "example/opaque TestReaddir/ext4", "example/faults TestMount/xfs"} {
		if s[i].Test != want {
			t.Errorf("splat %d (%s) while %q, want %q", i, s[i].Kind, s[i].Test, want)
		}
	}
}

func TestLockdepOffCauses(t *testing.T) {
	got := LockdepOffCauses([]string{
		"[    1.0] ovlkit: run example/faults TestMount",
		"[    1.5] Disabling lock debugging due to kernel taint",
		"[    2.0] ovlkit: run example/faults TestReaddir",
		"[    2.5] INFO: lockdep is turned off.",
	})
	if len(got) != 1 || !strings.Contains(got[0], "Disabling lock debugging") ||
		!strings.HasSuffix(got[0], "(while example/faults TestMount was running)") {
		t.Errorf("causes %q", got)
	}
}
