//go:build ovlkit_guest

package fuselower

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// opaqueCase is one answer of the FUSE server to getxattr of the opaque
// xattr on d.
type opaqueCase struct {
	name   string // subtest name
	label  string // as in the documentation table
	answer opaqueAnswer
}

func errnoCase(e syscall.Errno) opaqueCase {
	return opaqueCase{name: errnoLabel(e), label: errnoLabel(e), answer: opaqueAnswer{errno: e}}
}

// errnoLabel names e. EOPNOTSUPP and ENOTSUP are one value on Linux;
// overlayfs code and the documentation call it EOPNOTSUPP.
func errnoLabel(e syscall.Errno) string {
	if e == unix.EOPNOTSUPP {
		return "EOPNOTSUPP"
	}
	return unix.ErrnoName(e)
}

func valueCase(name, v string) opaqueCase {
	return opaqueCase{name: "value-" + name, label: fmt.Sprintf("value %q", v), answer: opaqueAnswer{value: v}}
}

// cases are the answers FUSE and virtiofs servers are known to give:
// their backing store's read error (EIO), a policy refusal (EPERM,
// EACCES), no xattr support (EOPNOTSUPP, or ENOSYS, which the kernel's
// FUSE client turns into EOPNOTSUPP and then stops asking), no such
// attribute (ENODATA), ERANGE (what an over-long value gives), EINVAL and
// ENOMEM from servers that pass on odd errors; and the values layer tools
// and newer kernels write.
var cases = []opaqueCase{
	errnoCase(unix.EIO),
	errnoCase(unix.EPERM),
	errnoCase(unix.EACCES),
	errnoCase(unix.EOPNOTSUPP),
	errnoCase(unix.ENOSYS),
	errnoCase(unix.ENODATA),
	errnoCase(unix.ERANGE),
	errnoCase(unix.EINVAL),
	errnoCase(unix.ENOMEM),
	valueCase("y", "y"),
	valueCase("x", "x"),
	valueCase("yes", "yes"),
	valueCase("empty", ""),
}

// variant is one way of stacking the FUSE lower.
type variant struct {
	name      string
	upper     bool     // tmpfs upper and work dir on top
	opts      []string // extra mount options
	userxattr bool     // overlay xattrs in the user namespace
}

var variants = []variant{
	{name: "lower-only"},
	{name: "upper", upper: true},
	{name: "lower-only-userxattr", opts: []string{"userxattr"}, userxattr: true},
}

// opaqueName is the xattr name overlayfs reads in v.
func (v variant) opaqueName() string {
	if v.userxattr {
		return opaqueNames[1]
	}
	return opaqueNames[0]
}

// Results of the readdir of d: the FUSE lower's entry alone when d is
// opaque, merged with the tmpfs lower's entry when it is not.
var (
	fuseOnlyNames = []string{"f"}
	mergedNames   = []string{"f", "hidden"}
	cellOpaque    = "opaque"
	cellNotOpaque = "not opaque"
)

// observation is what one overlay mount showed.
type observation struct {
	mountErr   error
	lstatErr   error    // lstat d
	names      []string // readdir d
	readdirErr error
	readErr    error // read d/f, or its content when wrong
	hiddenErr  error // lstat d/hidden: nil when it shows
	topErr     error // read top
	calls      int   // getxattr requests of the opaque xattr on d
	kmsg       []string
}

// tmpfs returns the guest's tmpfs scratch filesystem: every layer but the
// FUSE one is on tmpfs, so the results do not depend on a disk.
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

// observe mounts an overlay of the FUSE lower answering c over a tmpfs
// lower holding d/hidden, in the way v says and with extra options, and
// records what lookup, readdir and read show. The overlay stays mounted
// until the test ends; the returned layers name its directories.
func observe(t *testing.T, c opaqueCase, v variant, extra ...string) (observation, guesttest.Layers) {
	t.Helper()
	l := guesttest.NewLayers(t, tmpfs(t).Scratch(t, ""), 2)
	if !v.upper {
		l.Upper, l.Work = "", ""
	}
	mkdir(t, filepath.Join(l.Lower[1], "d"))
	writeFile(t, filepath.Join(l.Lower[1], "d", "hidden"), "lower below the FUSE layer\n")
	dir := startLower(t, l.Lower[0], c.answer)

	k := guesttest.OpenKmsg(t)
	var o observation
	o.mountErr = l.TryMount(t, append(slices.Clone(v.opts), extra...)...)
	if o.mountErr == nil {
		m := l.Merged
		var st unix.Stat_t
		o.lstatErr = unix.Lstat(filepath.Join(m, "d"), &st)
		if o.lstatErr == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			o.lstatErr = fmt.Errorf("d has mode %o, want a directory", st.Mode)
		}
		o.names, o.readdirErr = guesttest.ReadNames(filepath.Join(m, "d"))
		o.readErr = readExpect(filepath.Join(m, "d", "f"), fileContent)
		o.hiddenErr = unix.Lstat(filepath.Join(m, "d", "hidden"), &st)
		o.topErr = readExpect(filepath.Join(m, "top"), topContent)
	}
	o.calls = dir.Calls(v.opaqueName())
	for _, line := range k.Lines(t) {
		if strings.Contains(line, "overlayfs") || strings.Contains(line, "fuse") {
			o.kmsg = append(o.kmsg, line)
		}
	}
	return o, l
}

// cell sums o up for the documentation table: "opaque", "not opaque",
// "lookup of d fails: E", "mount fails: E", or every result when they fit
// none of these.
func (o observation) cell() string {
	if o.mountErr != nil {
		return "mount fails: " + errName(o.mountErr)
	}
	if o.topErr != nil {
		return o.detail()
	}
	if o.lstatErr != nil {
		e := errnoOf(o.lstatErr)
		if e != 0 && errnoOf(o.readdirErr) == e && errnoOf(o.readErr) == e && errnoOf(o.hiddenErr) == e {
			return "lookup of d fails: " + errnoLabel(e)
		}
		return o.detail()
	}
	if o.readdirErr != nil || o.readErr != nil {
		return o.detail()
	}
	switch {
	case slices.Equal(o.names, mergedNames) && o.hiddenErr == nil:
		return cellNotOpaque
	case slices.Equal(o.names, fuseOnlyNames) && errors.Is(o.hiddenErr, unix.ENOENT):
		return cellOpaque
	}
	return o.detail()
}

// detail lists every result of o.
func (o observation) detail() string {
	if o.mountErr != nil {
		return "mount: " + errName(o.mountErr)
	}
	readdir := strings.Join(o.names, ",")
	if o.readdirErr != nil {
		readdir = errName(o.readdirErr)
	}
	return fmt.Sprintf("lstat d: %s; readdir d: [%s]; read d/f: %s; lstat d/hidden: %s; read top: %s",
		errName(o.lstatErr), readdir, errName(o.readErr), errName(o.hiddenErr), errName(o.topErr))
}

// errName is the errno name inside err, "ok" for nil, or the error text.
func errName(err error) string {
	if err == nil {
		return "ok"
	}
	if e := errnoOf(err); e != 0 {
		return errnoLabel(e)
	}
	return err.Error()
}

// errnoOf returns the errno inside err, or 0 when there is none.
func errnoOf(err error) unix.Errno {
	var errno unix.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return 0
}

// readExpect reads path and fails when it does not hold want.
func readExpect(path, want string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if string(b) != want {
		return fmt.Errorf("%s holds %q, want %q", path, b, want)
	}
	return nil
}

func mkdir(t testing.TB, path string) {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatalf("mkdir %s: %v", path, err)
	}
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}

// superOptions returns the per-superblock options of the mount on target
// (field 11 of /proc/self/mountinfo), where overlayfs shows its options.
func superOptions(target string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || f[4] != target {
			continue
		}
		for i, x := range f {
			if x == "-" && i+3 < len(f) {
				return strings.Split(f[i+3], ","), nil
			}
		}
	}
	return nil, fmt.Errorf("%s is not in /proc/self/mountinfo", target)
}
