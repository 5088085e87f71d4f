//go:build ovlkit_guest

package abi

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/euank/go-kmsg-parser/kmsgparser"
	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// kmsgLogger collects what go-kmsg-parser reports instead of a message: a
// record it cannot parse is dropped with a warning, so a warning is a
// record lost to every program built on the parser.
type kmsgLogger struct {
	mu       sync.Mutex
	problems []string
}

func (l *kmsgLogger) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.problems = append(l.problems, fmt.Sprintf(format, args...))
}

func (l *kmsgLogger) Infof(string, ...any)                {}
func (l *kmsgLogger) Warningf(format string, args ...any) { l.add(format, args...) }
func (l *kmsgLogger) Errorf(format string, args ...any)   { l.add(format, args...) }

// TestKmsgParser reads the whole kernel log, including what the series
// prints about an opaque xattr value holding a newline and a log level,
// with github.com/euank/go-kmsg-parser, the /dev/kmsg reader of
// Kubernetes' node-problem-detector and cAdvisor. Every record must
// parse, and none may be forged from the value: the kernel has to escape
// it (the series prints it with %*pE). A kernel that prints nothing about
// the value (stock) passes as long as the log parses.
func TestKmsgParser(t *testing.T) {
	guesttest.Keeps(t, "/dev/kmsg, with the series' warnings about hostile xattr values, reads back through euank/go-kmsg-parser")
	// At most 8 bytes: the series shows longer values by their length
	// only. The newline and level are what a forged record would need.
	const forged = "ZQZQ"
	dir := t.TempDir()
	lower, upper, work, merged := filepath.Join(dir, "lower"), filepath.Join(dir, "upper"),
		filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	// The value goes on the upper dir: overlayfs reads the opaque xattr
	// of every layer but the lowest, where nothing is left to hide.
	for _, d := range []string{filepath.Join(lower, "opq"), filepath.Join(upper, "opq"), work, merged} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	value := []byte("\n<0>" + forged)
	if err := unix.Setxattr(filepath.Join(upper, "opq"), "trusted.overlay.opaque", value, 0); err != nil {
		t.Fatalf("set trusted.overlay.opaque on the upper dir: %v", err)
	}
	data := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if err := unix.Mount("overlay", merged, "overlay", 0, data); err != nil {
		t.Fatalf("mount overlay %s: %v", data, err)
	}
	if _, err := os.ReadDir(filepath.Join(merged, "opq")); err != nil {
		t.Errorf("read the dir with the hostile opaque value: %v", err)
	}
	if err := unix.Unmount(merged, 0); err != nil {
		t.Fatalf("umount %s: %v", merged, err)
	}

	// A record of the test's own marks the end of what it reads.
	marker := fmt.Sprintf("ovlkit-kmsg-end %d", time.Now().UnixNano())
	if err := os.WriteFile("/dev/kmsg", []byte("<6>"+marker+"\n"), 0); err != nil {
		t.Fatalf("write the end marker to /dev/kmsg: %v", err)
	}

	p, err := kmsgparser.NewParser()
	if err != nil {
		t.Fatalf("kmsgparser.NewParser: %v", err)
	}
	log := &kmsgLogger{}
	p.SetLogger(log)
	var msgs []kmsgparser.Message
	timeout := time.After(30 * time.Second)
	records := p.Parse()
read:
	for {
		select {
		case m, ok := <-records:
			if !ok {
				break read
			}
			msgs = append(msgs, m)
			if strings.Contains(m.Message, marker) {
				break read
			}
		case <-timeout:
			t.Errorf("no end marker within 30s after %d records", len(msgs))
			break read
		}
	}
	p.Close()

	log.mu.Lock()
	problems := append([]string(nil), log.problems...)
	log.mu.Unlock()
	for _, pr := range problems {
		// Closing the reader to stop the parser ends its loop with an
		// error of its own; every other report is a record lost.
		if strings.Contains(pr, "file already closed") {
			continue
		}
		t.Errorf("go-kmsg-parser: %s", pr)
	}
	if len(msgs) == 0 || !strings.Contains(msgs[len(msgs)-1].Message, marker) {
		t.Fatalf("the end marker %q did not come back intact after %d records", marker, len(msgs))
	}
	var ours []kmsgparser.Message
	for _, m := range msgs {
		if strings.HasPrefix(strings.TrimSpace(m.Message), forged) {
			t.Errorf("record %d forged from an xattr value: priority %d, %q", m.SequenceNumber, m.Priority, m.Message)
		}
		if strings.Contains(m.Message, forged) {
			ours = append(ours, m)
		}
	}
	for _, m := range ours {
		t.Logf("record %d, priority %d: %s", m.SequenceNumber, m.Priority, m.Message)
		if !strings.HasPrefix(m.Message, "overlayfs: ") {
			t.Errorf("record %d shows the value but is not overlayfs's: %q", m.SequenceNumber, m.Message)
		}
		// The text is the record's first line; the lines after it are
		// the kernel's " KEY=value" dictionary. A raw newline from the
		// value would start a line of its own.
		_, rest, _ := strings.Cut(m.Message, "\n")
		for _, l := range strings.Split(strings.TrimSuffix(rest, "\n"), "\n") {
			if l != "" && !strings.HasPrefix(l, " ") {
				t.Errorf("record %d holds the value's raw newline: %q", m.SequenceNumber, m.Message)
			}
		}
	}
	t.Logf("%d records parsed, %d about the hostile value", len(msgs), len(ours))
}
