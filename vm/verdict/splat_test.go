package verdict

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

func TestFindSplatsKnowsEveryLockdepHeader(t *testing.T) {
	for _, h := range []string{
		"WARNING: possible irq lock inversion dependency detected",
		"WARNING: HARDIRQ-safe -> HARDIRQ-unsafe lock order detected",
		"WARNING: lock held when returning to user space!",
		"WARNING: held lock freed!",
		"WARNING: Nested lock was not taken",
		"WARNING: bad contention detected!",
		"WARNING: chain_key collision",
		"WARNING: faults.test/412 still has locks held!",
	} {
		if got := FindSplats([]string{"[    5.0] " + h}); len(got) != 1 || got[0].Kind != "lockdep" {
			t.Errorf("%q: %+v", h, got)
		}
	}
}
