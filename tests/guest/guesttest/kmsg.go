//go:build ovlkit_guest

package guesttest

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Kmsg follows the kernel log from the moment it is opened, so a test reads
// exactly the messages its own actions caused.
type Kmsg struct {
	f *os.File
}

// OpenKmsg opens /dev/kmsg positioned at its end.
func OpenKmsg(t testing.TB) *Kmsg {
	t.Helper()
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open /dev/kmsg: %v", err)
	}
	if _, err := unix.Seek(fd, 0, 2); err != nil {
		unix.Close(fd)
		t.Fatalf("seek /dev/kmsg: %v", err)
	}
	k := &Kmsg{f: os.NewFile(uintptr(fd), "/dev/kmsg")}
	t.Cleanup(func() { k.f.Close() })
	return k
}

// testMarkerPrefix starts the line the guest init logs when a test starts
// (initramfs/ovlinit), so that kernel reports can name the running test.
// It names the test, so it would match what tests look for in the log.
const testMarkerPrefix = "ovlkit: run "

// Lines returns the messages logged since the previous call (or since
// OpenKmsg), without their priority and sequence prefix, and without the
// guest init's test markers.
func (k *Kmsg) Lines(t testing.TB) []string {
	t.Helper()
	var out []string
	buf := make([]byte, 8192)
	for {
		n, err := unix.Read(int(k.f.Fd()), buf)
		if errors.Is(err, unix.EAGAIN) {
			return out
		}
		if errors.Is(err, unix.EPIPE) { // overwritten records: keep reading
			continue
		}
		if err != nil {
			t.Fatalf("read /dev/kmsg: %v", err)
		}
		rec := string(buf[:n])
		if _, msg, ok := strings.Cut(rec, ";"); ok {
			msg, _, _ = strings.Cut(msg, "\n")
			if !strings.HasPrefix(msg, testMarkerPrefix) {
				out = append(out, msg)
			}
		}
	}
}

// Expect waits briefly for a message containing substr and returns it; it
// fails the test when none arrives. Messages are printed synchronously by
// the syscall that causes them, so the wait only covers deferred work.
func (k *Kmsg) Expect(t testing.TB, substr string) string {
	t.Helper()
	var seen []string
	deadline := time.Now().Add(2 * time.Second)
	for {
		for _, l := range k.Lines(t) {
			seen = append(seen, l)
			if strings.Contains(l, substr) {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("kernel log has no message containing %q; saw:\n%s", substr, strings.Join(seen, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Contains reports whether any message since the last read contains substr.
func (k *Kmsg) Contains(t testing.TB, substr string) bool {
	t.Helper()
	for _, l := range k.Lines(t) {
		if strings.Contains(l, substr) {
			return true
		}
	}
	return false
}
