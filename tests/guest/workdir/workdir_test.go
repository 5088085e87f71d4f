//go:build ovlkit_guest

// Package workdir holds the guest tests of part 1 of the series: how an
// overlay treats its work directory and the features of its upper
// filesystem at mount time (a work dir shared by two mounts, the
// strict_upper option, and probes on a full upper filesystem).
package workdir

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// Subjects of the patches these tests prove, exactly as in patches/6.1.
const (
	subjectSharedWorkdir = "ovl: do not tear down the work dir of a mounted overlay sharing it"
	subjectStrictUpper   = "ovl: add strict_upper option to fail instead of degrading"
	subjectFullUpper     = "ovl: do not fail the mount or disable tmpfile on ENOSPC during upper probes"
)

// inUseMsg is the start of the kernel's report of an upper or work dir
// that another overlay mount is using.
const inUseMsg = "is in-use as upperdir/workdir of another mount"

// mountOptions returns the options field of the mount at target in
// /proc/self/mounts, or fails the test when nothing is mounted there.
func mountOptions(t *testing.T, target string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		t.Fatalf("open mounts: %v", err)
	}
	defer f.Close()
	var opts []string
	found := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[1] != target {
			continue
		}
		// The last mount on target is the one that is visible.
		opts = strings.Split(fields[3], ",")
		found = true
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read mounts: %v", err)
	}
	if !found {
		t.Fatalf("nothing mounted on %s", target)
	}
	return opts
}

// errnoOf returns the errno inside err, or 0 when there is none.
func errnoOf(err error) unix.Errno {
	var errno unix.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return 0
}

// secondMount returns layers that share lower, upper and work dirs with l
// but are mounted on their own mount point beneath base.
func secondMount(t *testing.T, l guesttest.Layers, base, name string) guesttest.Layers {
	t.Helper()
	m := l
	m.Merged = filepath.Join(base, name)
	guestfs.MkdirAll(t, m.Merged)
	return m
}
