//go:build ovlkit_guest

package faults

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// failslabDir holds failslab's knobs (CONFIG_FAULT_INJECTION_DEBUG_FS).
const failslabDir = "/sys/kernel/debug/failslab"

// maxSweep bounds a sweep: no overlay syscall here makes this many slab
// allocations, so reaching it means the sweep never ends (an allocation
// that is retried forever, say).
const maxSweep = 1500

// setupFailslab lets fail-nth reach the allocations overlayfs makes. By
// default failslab ignores allocations that may sleep (GFP_KERNEL), which
// are nearly all of them. verbose=1 logs one line per injected failure
// instead of a stack dump: a sweep injects hundreds.
func setupFailslab() (restore func(), err error) {
	knobs := []struct{ name, value string }{
		{"ignore-gfp-wait", "N"},
		{"verbose", "1"},
	}
	var undo []func()
	restore = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	for _, k := range knobs {
		p := failslabDir + "/" + k.name
		old, err := os.ReadFile(p)
		if err != nil {
			restore()
			return nil, fmt.Errorf("failslab knob %s (kernel without CONFIG_FAILSLAB and CONFIG_FAULT_INJECTION_DEBUG_FS?): %w", k.name, err)
		}
		if err := os.WriteFile(p, []byte(k.value), 0); err != nil {
			restore()
			return nil, fmt.Errorf("set failslab %s=%s: %w", k.name, k.value, err)
		}
		undo = append(undo, func() { _ = os.WriteFile(p, old, 0) })
	}
	return restore, nil
}

// failNth is /proc/thread-self/fail-nth of one OS thread: writing N makes
// the Nth slab allocation that thread makes fail (failslab counts every
// call that passes its filters); the file reads 0 once that happened.
type failNth struct {
	fd   int
	rbuf []byte
	zero []byte
}

// openFailNth opens the calling thread's fail-nth. The caller must hold
// runtime.LockOSThread for as long as it uses the result.
func openFailNth() (*failNth, error) {
	fd, err := unix.Open("/proc/thread-self/fail-nth", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /proc/thread-self/fail-nth (kernel without CONFIG_FAULT_INJECTION?): %w", err)
	}
	return &failNth{fd: fd, rbuf: make([]byte, 32), zero: []byte("0")}, nil
}

func (f *failNth) close() { unix.Close(f.fd) }

// arm makes the nth allocation from now on fail.
func (f *failNth) arm(n int) error {
	if _, err := unix.Pwrite(f.fd, []byte(strconv.Itoa(n)), 0); err != nil {
		return fmt.Errorf("write fail-nth %d: %w", n, err)
	}
	return nil
}

// disarm reports whether the armed failure happened and clears what is
// left of the count, so no later allocation fails. Nothing in between
// allocates: pread of fail-nth only formats a number.
func (f *failNth) disarm() (fired bool, err error) {
	n, rerr := unix.Pread(f.fd, f.rbuf, 0)
	if _, werr := unix.Pwrite(f.fd, f.zero, 0); werr != nil {
		return false, fmt.Errorf("clear fail-nth: %w", werr)
	}
	if rerr != nil {
		return false, fmt.Errorf("read fail-nth: %w", rerr)
	}
	left, err := strconv.Atoi(strings.TrimSpace(string(f.rbuf[:n])))
	if err != nil {
		return false, fmt.Errorf("fail-nth reads %q: %w", f.rbuf[:n], err)
	}
	return left == 0, nil
}

// A step is one sweep iteration. prepare runs before the failure is armed
// and returns the syscall to run with it armed; that function must make
// the syscall and nothing else the kernel would count (no Go allocation
// that could grow the heap, no other syscall), so prepare converts every
// argument beforehand. judge runs after the failure is disarmed.
type step struct {
	prepare func(n int) (syscall func() error)
	judge   func(n int, err error, fired bool)
}

// sweep runs the syscall of s with its 1st, 2nd, ... slab allocation
// failed until it runs through without reaching the armed one: every
// allocation the syscall makes has then failed once, whichever code made
// it. It returns how many allocations were failed.
func sweep(t *testing.T, s step) int {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	f, err := openFailNth()
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	for n := 1; n <= maxSweep; n++ {
		call := s.prepare(n)
		if t.Failed() {
			return n - 1
		}
		if err := f.arm(n); err != nil {
			t.Fatal(err)
		}
		callErr := call()
		fired, err := f.disarm()
		if err != nil {
			t.Fatal(err)
		}
		s.judge(n, callErr, fired)
		if t.Failed() || !fired {
			return n - 1
		}
	}
	t.Fatalf("the syscall still reached its %dth allocation: the sweep does not end", maxSweep)
	return maxSweep
}

// errno turns a raw syscall result into an error (nil for 0).
func errno(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// isAny reports whether err is one of the given errnos.
func isAny(err error, errs ...unix.Errno) bool {
	for _, e := range errs {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
