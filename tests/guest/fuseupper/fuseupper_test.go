//go:build ovlkit_guest

package fuseupper

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// Subject of the patch the fallback test proves, exactly as in the series
// of every base.
const subjectTmpfile = "ovl: do not fail the mount or disable tmpfile on ENOSPC during upper probes"

// Kernel log lines about tmpfile: what the probe prints when it turns
// tmpfile copy-up off (stock, on any error), what the series' probe prints
// when ENOSPC leaves it on, and what the series' copy-up prints when it then
// learns that the upper has no tmpfile after all.
const (
	probeOff          = "upper fs does not support tmpfile."
	probeInconclusive = "cannot check tmpfile support (errno: 28); assuming it is supported."
	fallbackWarning   = "upper fs does not support tmpfile, copying up through workdir."
)

// lowerFile is a file of the lower layer that a test copies up.
type lowerFile struct {
	name    string
	content string
	mode    os.FileMode
}

// lowerFiles are copied up one after the other: the first copy-up is the
// one that can learn that tmpfile is missing, the second shows what
// happens once that is known. Their modes differ from the default so that
// a copy-up that loses the mode shows.
var lowerFiles = []lowerFile{
	{name: "a", content: "a in the lower layer\n", mode: 0o640},
	{name: "b", content: "b in the lower layer\n", mode: 0o604},
}

// concurrentFiles are copied up at the same time, each by its own
// goroutine.
var concurrentFiles = []lowerFile{
	{name: "c0", content: "c0 in the lower layer\n", mode: 0o640},
	{name: "c1", content: "c1 in the lower layer\n", mode: 0o604},
	{name: "c2", content: "c2 in the lower layer\n", mode: 0o660},
	{name: "c3", content: "c3 in the lower layer\n", mode: 0o600},
}

// stack is an overlay of a tmpfs lower under the FUSE upper.
type stack struct {
	l       guesttest.Layers
	backing string // the directory the FUSE server serves: upper and work
	srv     *upperFS
}

// tmpfs returns the guest's tmpfs scratch filesystem: every layer is on
// tmpfs, the upper and work dirs through FUSE, so the results do not
// depend on a disk.
func tmpfs(t testing.TB) guesttest.FS {
	t.Helper()
	for _, fs := range guesttest.Filesystems() {
		if fs.Name == "tmpfs" {
			return fs
		}
	}
	t.Fatal("no tmpfs in guesttest.Filesystems")
	return guesttest.FS{}
}

func mkdir(t testing.TB, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("mkdir %s: %v", dir, err)
	}
}

// newStack makes the lower files and starts the FUSE server of the upper,
// whose TMPFILE requests get answers, held as together says (see
// upperFS); the overlay is not mounted yet.
func newStack(t *testing.T, answers []syscall.Errno, together int) stack {
	t.Helper()
	base := tmpfs(t).Scratch(t, "")
	backing := filepath.Join(base, "backing")
	lower := filepath.Join(base, "lower")
	merged := filepath.Join(base, "merged")
	for _, d := range []string{filepath.Join(backing, "upper"), filepath.Join(backing, "work"), lower, merged} {
		mkdir(t, d)
	}
	for _, f := range append(append([]lowerFile(nil), lowerFiles...), concurrentFiles...) {
		p := filepath.Join(lower, f.name)
		if err := os.WriteFile(p, []byte(f.content), 0o600); err != nil {
			t.Fatalf("write %s: %v", p, err)
		}
		// Chmod, not the create mode, which the umask would change.
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatalf("chmod %s: %v", p, err)
		}
	}
	mnt := filepath.Join(base, "fuse")
	srv := startUpper(t, backing, mnt, answers, together)
	return stack{
		l: guesttest.Layers{
			Lower:  []string{lower},
			Upper:  filepath.Join(mnt, "upper"),
			Work:   filepath.Join(mnt, "work"),
			Merged: merged,
		},
		backing: backing,
		srv:     srv,
	}
}

// mount mounts the overlay and returns the kernel log lines since k was
// opened (or last read), which the mount's probes printed.
func (s stack) mount(t *testing.T, k *guesttest.Kmsg) []string {
	t.Helper()
	err := s.l.TryMount(t)
	lines := k.Lines(t)
	for _, line := range lines {
		t.Logf("kmsg: %s", line)
	}
	if err != nil {
		t.Fatalf("mount overlay with a FUSE upper (%s): %v", s.l.Options(), err)
	}
	return lines
}

// appendTo opens p for writing, which copies it up, and appends "+".
func appendTo(p string) error {
	w, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("open for write (copy-up to the FUSE upper): %w", err)
	}
	_, werr := w.WriteString("+")
	if err := w.Close(); err != nil && werr == nil {
		werr = err
	}
	if werr != nil {
		return fmt.Errorf("append after copy-up: %w", werr)
	}
	return nil
}

// checkCopiedUp checks f after appendTo: its content through the overlay,
// through the FUSE mount and in the server's store, and its mode in the
// upper layer.
func (s stack) checkCopiedUp(t *testing.T, f lowerFile) {
	t.Helper()
	want := f.content + "+"
	upper := filepath.Join(s.l.Upper, f.name)
	stored := filepath.Join(s.backing, "upper", f.name)
	for _, where := range []string{filepath.Join(s.l.Merged, f.name), upper, stored} {
		if b, err := os.ReadFile(where); err != nil || string(b) != want {
			t.Errorf("read %s after copy-up: %q, %v; want %q", where, b, err, want)
		}
	}
	for _, where := range []string{upper, stored} {
		fi, err := os.Lstat(where)
		if err != nil {
			t.Errorf("lstat %s: %v", where, err)
			continue
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm() != f.mode {
			t.Errorf("%s has mode %v after copy-up, want a regular file with %v as in the lower", where, fi.Mode(), f.mode)
		}
	}
}

// checkWorkEmpty checks that the work dir holds no temporary: a copy-up
// that failed half way, or fell back after creating one, would leave it.
func (s stack) checkWorkEmpty(t *testing.T, after string) {
	t.Helper()
	names, err := guesttest.ReadNames(filepath.Join(s.backing, "work", "work"))
	if err != nil || len(names) != 0 {
		t.Errorf("work/work after %s: %q, %v; want it empty", after, names, err)
	}
}

// copyUp copies f up with appendTo and checks it with checkCopiedUp. It
// returns the requests the server got meanwhile.
func (s stack) copyUp(t *testing.T, f lowerFile) []string {
	t.Helper()
	_, mark := s.srv.Ops(0)
	if err := appendTo(filepath.Join(s.l.Merged, f.name)); err != nil {
		t.Errorf("%s: %v", f.name, err)
	}
	ops, _ := s.srv.Ops(mark)
	t.Logf("FUSE requests during the copy-up of %s: %q", f.name, ops)
	s.checkCopiedUp(t, f)
	return ops
}

// throughWorkdir tells from the requests of one copy-up whether it went
// through the work dir: a temporary named "#N" there renamed to the file's
// name, and no link of an O_TMPFILE file to that name.
func throughWorkdir(ops []string, name string) error {
	renamed := false
	for _, op := range ops {
		if f := strings.Fields(op); len(f) == 3 && f[0] == "rename" && strings.HasPrefix(f[1], "#") && f[2] == name {
			renamed = true
		}
		if op == "link "+name {
			return fmt.Errorf("%s was linked into place (an O_TMPFILE copy-up)", name)
		}
	}
	if !renamed {
		return fmt.Errorf("no rename of a work dir temporary to %s", name)
	}
	return nil
}

func count(lines []string, substr string) int {
	n := 0
	for _, line := range lines {
		if strings.Contains(line, substr) {
			n++
		}
	}
	return n
}

func logKmsg(t *testing.T, lines []string) {
	t.Helper()
	for _, line := range lines {
		t.Logf("kmsg: %s", line)
	}
}

// noTmpfileCase is a FUSE upper without O_TMPFILE, by how it answers.
type noTmpfileCase struct {
	name    string
	answers []syscall.Errno
	// atMount is what the mount logs on both kernels, "" when the two
	// kernels differ (that is what TestFUSEUpperTmpfileFallback checks).
	atMount string
}

var noTmpfileCases = []noTmpfileCase{
	// A server that does not implement TMPFILE.
	{name: "ENOSYS", answers: []syscall.Errno{syscall.ENOSYS}, atMount: probeOff},
	// A server that refuses it every time.
	{name: "EOPNOTSUPP", answers: []syscall.Errno{syscall.EOPNOTSUPP}, atMount: probeOff},
	// A server that was full when the overlay mounted.
	{name: "ENOSPC-then-ENOSYS", answers: []syscall.Errno{syscall.ENOSPC, syscall.ENOSYS}},
}

// A FUSE upper without O_TMPFILE is an upper overlayfs supports (a remote
// upper needs d_type, xattrs and RENAME_WHITEOUT, not tmpfile). The
// overlay must mount on it and copy files up through the work dir, with
// their data and mode, however the server refuses TMPFILE and however the
// mount-time probe was answered: stock takes an ENOSPC there as "no
// tmpfile" at mount, the series only at the first copy-up. After the first
// copy-up the server sees no TMPFILE request, the work dir holds nothing
// between copy-ups, and the FUSE mount unmounts (not busy) once the
// overlay is gone: no reference to the upper is left behind.
func TestFUSEUpperCopyUpThroughWorkdir(t *testing.T) {
	guesttest.Keeps(t, "an overlay on a FUSE upper without O_TMPFILE mounts and copies files up through the work dir")
	for _, c := range noTmpfileCases {
		t.Run(c.name, func(t *testing.T) {
			s := newStack(t, c.answers, 0)
			k := guesttest.OpenKmsg(t)
			atMount := s.mount(t, k)
			if got := s.srv.Tmpfiles(); len(got) != 1 {
				t.Errorf("the FUSE server got %d TMPFILE requests (%v) while the overlay mounted, want 1: the O_TMPFILE probe", len(got), got)
			}
			if c.atMount != "" && count(atMount, c.atMount) != 1 {
				t.Errorf("no warning %q at mount", c.atMount)
			}
			afterFirst := 0
			for i, f := range lowerFiles {
				ops := s.copyUp(t, f)
				if err := throughWorkdir(ops, f.name); err != nil {
					t.Errorf("copy-up %d to the FUSE upper without tmpfile: %v; requests: %q", i+1, err, ops)
				}
				s.checkWorkEmpty(t, fmt.Sprintf("copy-up %d", i+1))
				if i == 0 {
					afterFirst = len(s.srv.Tmpfiles())
				}
			}
			if got := s.srv.Tmpfiles(); len(got) != afterFirst {
				t.Errorf("the FUSE server got TMPFILE requests after the first copy-up (answers %v, %d before): the kernel knew by then that it has no tmpfile", got, afterFirst)
			}
			after := k.Lines(t)
			logKmsg(t, after)
			if c.atMount != "" && count(after, fallbackWarning) != 0 {
				t.Errorf("warning %q after the probe had turned tmpfile off", fallbackWarning)
			}
		})
	}
}

// The series keeps tmpfile copy-up on when the O_TMPFILE probe fails with
// ENOSPC, since a full upper says nothing about the feature; the first
// tmpfile copy-up on an upper that really has none gets EOPNOTSUPP, turns
// tmpfile off with one warning and copies that file up through the work
// dir. Stock turns tmpfile off at the probe, never tries it at copy-up and
// prints neither warning. A FUSE server whose TMPFILE answers ENOSPC once
// and then ENOSYS or EOPNOTSUPP is such an upper. With ENOSYS the FUSE
// client stops asking by itself; with EOPNOTSUPP it asks every time, so no
// TMPFILE request after the first copy-up shows that overlayfs turned
// tmpfile off. The kernel's FUSE client has TMPFILE since 6.1 (protocol
// 7.37), so this runs on both kernel bases.
func TestFUSEUpperTmpfileFallback(t *testing.T) {
	guesttest.Proves(t, subjectTmpfile)
	for _, c := range []struct {
		name  string
		later syscall.Errno
	}{
		{"ENOSPC-then-ENOSYS", syscall.ENOSYS},
		{"ENOSPC-then-EOPNOTSUPP", syscall.EOPNOTSUPP},
	} {
		later := c.later
		t.Run(c.name, func(t *testing.T) {
			s := newStack(t, []syscall.Errno{syscall.ENOSPC, later}, 0)
			k := guesttest.OpenKmsg(t)
			atMount := s.mount(t, k)
			if count(atMount, probeInconclusive) != 1 {
				t.Errorf("no warning %q at mount, for the O_TMPFILE probe's ENOSPC", probeInconclusive)
			}
			if count(atMount, probeOff) != 0 {
				t.Errorf("the O_TMPFILE probe's ENOSPC turned tmpfile copy-up off at mount (%q)", probeOff)
			}
			probes := len(s.srv.Tmpfiles())

			ops := s.copyUp(t, lowerFiles[0])
			if got := s.srv.Tmpfiles()[probes:]; len(got) != 1 || got[0] != later {
				t.Errorf("the first copy-up sent %d TMPFILE requests (answers %v), want 1 answered %v: after an inconclusive probe copy-up must try tmpfile", len(got), got, unix.ErrnoName(later))
			}
			if err := throughWorkdir(ops, lowerFiles[0].name); err != nil {
				t.Errorf("the first copy-up did not fall back to the work dir: %v; requests: %q", err, ops)
			}
			s.checkWorkEmpty(t, "the fallback copy-up")
			afterFirst := len(s.srv.Tmpfiles())
			ops = s.copyUp(t, lowerFiles[1])
			if err := throughWorkdir(ops, lowerFiles[1].name); err != nil {
				t.Errorf("the second copy-up did not go through the work dir: %v; requests: %q", err, ops)
			}
			if got := s.srv.Tmpfiles(); len(got) != afterFirst {
				t.Errorf("the second copy-up sent TMPFILE requests (answers %v): the first had turned tmpfile copy-up off", got[afterFirst:])
			}

			after := k.Lines(t)
			logKmsg(t, after)
			if n := count(after, fallbackWarning); n != 1 {
				t.Errorf("%d warnings %q for two copy-ups, want 1: the first copy-up learns that the upper has no tmpfile", n, fallbackWarning)
			}
		})
	}
}

// Copy-ups that started with tmpfile on and are in the middle of it when
// one of them turns it off all fall back: the one that turns it off, and
// those that find it already off when their own tmpfile gets EOPNOTSUPP.
// The server holds the TMPFILE requests of four concurrent first copy-ups
// until all have arrived (the kernel takes no lock of the work dir around
// tmpfile creation), then answers all with EOPNOTSUPP, which the FUSE
// client does not remember, so that only overlayfs can stop a later
// copy-up from asking again. Every file must be
// copied up, through the work dir, and tmpfile must end up off with a
// warning (one per copy-up that saw it on, so at least one). Stock has
// turned tmpfile off at the probe and sends no request.
func TestFUSEUpperTmpfileFallbackConcurrent(t *testing.T) {
	guesttest.Proves(t, subjectTmpfile)
	n := len(concurrentFiles)
	s := newStack(t, []syscall.Errno{syscall.ENOSPC, syscall.EOPNOTSUPP}, n)
	k := guesttest.OpenKmsg(t)
	s.mount(t, k)
	probes := len(s.srv.Tmpfiles())

	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, f := range concurrentFiles {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = appendTo(filepath.Join(s.l.Merged, f.name))
		}()
	}
	wg.Wait()
	ops, _ := s.srv.Ops(0)
	t.Logf("FUSE requests since the mount: %q", ops)
	for i, f := range concurrentFiles {
		if errs[i] != nil {
			t.Errorf("concurrent copy-up of %s: %v", f.name, errs[i])
			continue
		}
		s.checkCopiedUp(t, f)
		if err := throughWorkdir(ops, f.name); err != nil {
			t.Errorf("concurrent copy-up of %s: %v", f.name, err)
		}
	}
	s.checkWorkEmpty(t, "the concurrent copy-ups")
	got := s.srv.Tmpfiles()[probes:]
	if together := s.srv.MaxTogether(); together < 2 {
		t.Errorf("%d TMPFILE requests of the concurrent copy-ups were held at once (answers %v), want 2 or more: no copy-up was in tmpfile when another turned it off", together, got)
	}
	after := k.Lines(t)
	logKmsg(t, after)
	if w := count(after, fallbackWarning); w < 1 || w > len(got) {
		t.Errorf("%d warnings %q for %d TMPFILE requests answered EOPNOTSUPP, want at least 1 and at most 1 per request", w, fallbackWarning, len(got))
	}
	// Tmpfile is off now: one more copy-up sends no TMPFILE.
	before := len(s.srv.Tmpfiles())
	s.copyUp(t, lowerFiles[0])
	if all := s.srv.Tmpfiles(); len(all) != before {
		t.Errorf("a copy-up after the concurrent ones sent TMPFILE requests (answers %v)", all[before:])
	}
}
