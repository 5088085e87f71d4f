//go:build ovlkit_guest

package graphsuite

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/ovl"
	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// The test binary re-enters itself through these variables: as the
// unprivileged intruder, and as the setuid program a hostile image ships,
// which only prints the effective uid it got.
const (
	intruderEnv = "OVLKIT_GRAPH_INTRUDER" // JSON-encoded intrusion
	euidEnv     = "OVLKIT_GRAPH_EUID"
)

// nobody is the unprivileged host user of the intruder.
const nobody = 65534

// init runs before TestMain, so the re-entered binary never starts the
// tests.
func init() {
	if os.Getenv(euidEnv) != "" {
		fmt.Printf("euid=%d", unix.Geteuid())
		os.Exit(0)
	}
	if p := os.Getenv(intruderEnv); p != "" {
		os.Exit(intrude(p))
	}
}

// intrusion is what the test tells the intruder.
type intrusion struct {
	Home    string   // the store; its mounts are found in mountinfo
	Dirs    []string // layer directories the test knows of, to attack too
	Control string   // outside the store: suid, null and disk there must work
	Disk    bool     // a dev/disk block device exists next to dev/null
	// Inside: descriptors 3 and 4 are the roots of the container's mount
	// and of the image's read-only view, handed over as a runtime hands
	// a container its root.
	Inside bool
}

// attempt is one thing the intruder tried.
type attempt struct {
	Op    string // list, exec, open, create, or control-* for the controls
	Path  string
	Errno int    // errno of the failure, 0 when it succeeded or failed otherwise
	Err   string // empty when the call succeeded
	Out   string // output of exec
}

type intruderReport struct {
	UID      int
	EUID     int
	Mounts   []string // overlay mount points below the home, from mountinfo
	Attempts []attempt
}

// intrude is the unprivileged side: everything a host user could do with
// the paths mountinfo shows.
func intrude(plan string) int {
	var in intrusion
	if err := json.Unmarshal([]byte(plan), &in); err != nil {
		fmt.Fprintln(os.Stderr, "intruder:", err)
		return 2
	}
	rep := intruderReport{UID: unix.Getuid(), EUID: unix.Geteuid()}
	record := func(op, path string, out string, err error) {
		a := attempt{Op: op, Path: path, Out: out}
		if err != nil {
			a.Err = err.Error()
			var errno unix.Errno
			if errors.As(err, &errno) {
				a.Errno = int(errno)
			}
		}
		rep.Attempts = append(rep.Attempts, a)
	}
	list := func(op, dir string) {
		f, err := os.Open(dir)
		if err == nil {
			_, err = f.Readdirnames(-1)
			f.Close()
		}
		record(op, dir, "", err)
	}
	run := func(op, path string) {
		cmd := exec.Command(path)
		cmd.Env = []string{euidEnv + "=1"}
		out, err := cmd.Output()
		record(op, path, string(out), err)
	}
	open := func(op, path string, flag int) {
		fd, err := unix.Open(path, flag|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err == nil {
			unix.Close(fd)
		}
		record(op, path, "", err)
	}
	create := func(path string) {
		fd, err := unix.Open(path, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err == nil {
			unix.Close(fd)
			os.Remove(path)
		}
		record("create", path, "", err)
	}

	// The controls: the same things outside the store work, so the store
	// is what stops them, not the filesystem or the guest.
	list("control-list", in.Control)
	run("control-exec", filepath.Join(in.Control, "suid"))
	open("control-open", filepath.Join(in.Control, "null"), unix.O_RDWR)
	if in.Disk {
		open("control-open", filepath.Join(in.Control, "disk"), unix.O_RDONLY)
	}

	// Inside the mounts, as a process whose root they are: the
	// container keeps setuid and devices, the image view has neither.
	if in.Inside {
		run("inside-ctr-exec", "/proc/self/fd/3/bin/suid")
		open("inside-ctr-open", "/proc/self/fd/3/dev/null", unix.O_RDWR)
		run("inside-image-exec", "/proc/self/fd/4/bin/suid")
		open("inside-image-open", "/proc/self/fd/4/dev/null", unix.O_RDWR)
	}

	dirs := []string{in.Home, filepath.Join(in.Home, "layers"), filepath.Join(in.Home, "l")}
	mounts, layerDirs, err := overlaysBelow(in.Home)
	if err != nil {
		fmt.Fprintln(os.Stderr, "intruder:", err)
		return 2
	}
	rep.Mounts = mounts
	seen := map[string]bool{}
	for _, d := range append(append(append(dirs, mounts...), layerDirs...), in.Dirs...) {
		if seen[d] {
			continue
		}
		seen[d] = true
		list("list", d)
		run("exec", filepath.Join(d, "bin/suid"))
		open("open", filepath.Join(d, "dev/null"), unix.O_RDWR)
		if in.Disk {
			open("open", filepath.Join(d, "dev/disk"), unix.O_RDONLY)
		}
		create(filepath.Join(d, "owned"))
		create(filepath.Join(d, "tmp/owned"))
	}
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		fmt.Fprintln(os.Stderr, "intruder:", err)
		return 2
	}
	return 0
}

// overlaysBelow reads /proc/self/mountinfo as any user can: the overlay
// mount points below home and the layer directories their options name.
func overlaysBelow(home string) (mounts, dirs []string, err error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, nil, fmt.Errorf("read mountinfo: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 || g[0] != "overlay" {
			continue
		}
		mp := ovl.UnescapeMountField(f[4])
		if !strings.HasPrefix(mp, home+"/") {
			continue
		}
		mounts = append(mounts, mp)
		for _, o := range strings.Split(g[2], ",") {
			k, v, _ := strings.Cut(o, "=")
			if k != "lowerdir" && k != "upperdir" {
				continue
			}
			for _, d := range strings.Split(v, ":") {
				d = ovl.UnescapeMountField(d)
				if !filepath.IsAbs(d) {
					// The relative form of the mount data names the
					// short links in home/l.
					d = filepath.Join(home, "l", d)
				}
				dirs = append(dirs, d)
			}
		}
	}
	return mounts, dirs, nil
}

// hostileLayer is the image layer of the finding: a root of mode 0777, a
// world-writable sticky tmp/, a setuid-root copy of exe and world-usable
// device nodes, one of them (disk, when rdev is not zero) a block device
// aliasing a disk of the guest.
func hostileLayer(t *testing.T, exe []byte, disk uint64) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdrs := []*tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o777},
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "bin/suid", Typeflag: tar.TypeReg, Mode: 0o4755, Size: int64(len(exe))},
		{Name: "dev/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3},
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
	}
	if disk != 0 {
		hdrs = append(hdrs, &tar.Header{Name: "dev/disk", Typeflag: tar.TypeBlock, Mode: 0o666,
			Devmajor: int64(unix.Major(disk)), Devminor: int64(unix.Minor(disk))})
	}
	for _, h := range hdrs {
		h.Format = tar.FormatPAX
		must(t, tw.WriteHeader(h))
		if h.Typeflag == tar.TypeReg {
			_, err := tw.Write(exe)
			must(t, err)
		}
	}
	must(t, tw.Close())
	return buf.Bytes()
}

// guestDisk is the device number of fs's disk, or of any disk of the
// guest for tmpfs; zero when there is none.
func guestDisk(t *testing.T, fs guesttest.FS) uint64 {
	t.Helper()
	dev := fs.Device
	for _, o := range guesttest.Filesystems() {
		if dev == "" {
			dev = o.Device
		}
	}
	if dev == "" {
		return 0
	}
	var st unix.Stat_t
	must(t, unix.Stat(dev, &st))
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		t.Fatalf("%s is not a block device", dev)
	}
	return st.Rdev
}

// copyExe copies the running test binary to path with mode, owned by root.
func copyExe(t *testing.T, exe []byte, path string, mode uint32) {
	t.Helper()
	must(t, os.WriteFile(path, exe, 0o700))
	must(t, os.Chown(path, 0, 0))
	// unix.Chmod: os.Chmod takes the setuid bit only as os.ModeSetuid.
	must(t, unix.Chmod(path, mode))
}

// perMountOptions returns the per-mount options (not the superblock's) of the
// mount at path, from mountinfo.
func perMountOptions(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	must(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && ovl.UnescapeMountField(f[4]) == path {
			return strings.Split(f[5], ",")
		}
	}
	t.Fatalf("%s is not a mount point", path)
	return nil
}

// TestHostUserCannotReachLayers is the store-security finding (the class
// of moby CVE-2021-41091 and containerd CVE-2021-41103): as root, an image
// layer with a setuid-root program, world-usable device nodes (one
// aliasing a disk) and a world-writable root is applied, a container layer
// is made on it and both are mounted. An unprivileged host user then
// reads the paths from mountinfo and tries to list the store, run the
// program, open the devices and write into the layers, through the
// mounts and through the layer directories. Every attempt must fail with
// EACCES or EPERM (or the program must run without euid 0), while the
// same setuid program and devices outside the store work for that user.
// The read-only view of the image must carry nosuid and nodev; the
// container's own mount keeps setuid and device semantics inside it.
func TestHostUserCannotReachLayers(t *testing.T) {
	exe, err := os.ReadFile("/proc/self/exe")
	must(t, err)
	forEach(t, func(t *testing.T, fs guesttest.FS, layout graph.Layout) {
		scratch := fs.Scratch(t, "")
		// A store usually lives below a world-searchable directory
		// (/var/lib); only the store's own permissions may stop the
		// intruder.
		must(t, os.Chmod(scratch, 0o755))
		control := filepath.Join(scratch, "control")
		must(t, os.Mkdir(control, 0o755))
		must(t, os.Chmod(control, 0o755))
		helper := filepath.Join(control, "intruder")
		copyExe(t, exe, helper, 0o755)
		copyExe(t, exe, filepath.Join(control, "suid"), 0o4755)
		must(t, unix.Mknod(filepath.Join(control, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
		must(t, os.Chmod(filepath.Join(control, "null"), 0o666))
		disk := guestDisk(t, fs)
		if disk != 0 {
			must(t, unix.Mknod(filepath.Join(control, "disk"), unix.S_IFBLK|0o666, int(disk)))
			must(t, os.Chmod(filepath.Join(control, "disk"), 0o666))
		}

		home := filepath.Join(scratch, "store")
		s, err := graph.Open(home, graph.Options{Create: true, Layout: layout, Features: features(t, fs), Sync: graph.SyncNone})
		if err != nil {
			t.Fatalf("open store: %v", err)
		}
		t.Cleanup(func() {
			if err := s.Cleanup(); err != nil {
				t.Errorf("cleanup: %v", err)
			}
			s.Close()
		})
		must(t, s.Create(context.Background(), "image", ""))
		apply(t, s, "image", hostileLayer(t, exe, disk))
		must(t, s.CreateReadWrite(context.Background(), "ctr", "image"))
		ctr := get(t, s, "ctr")
		defer put(t, s, "ctr")
		img := get(t, s, "image")
		defer put(t, s, "image")

		// Root's side: the container sees what the image shipped, and the
		// mount flags are as documented.
		if opts := perMountOptions(t, img); !slices.Contains(opts, "nosuid") || !slices.Contains(opts, "nodev") {
			t.Errorf("read-only image view %s mounted with %v, want nosuid and nodev", img, opts)
		}
		if opts := perMountOptions(t, ctr); slices.Contains(opts, "nosuid") || slices.Contains(opts, "nodev") {
			t.Errorf("container mount %s mounted with %v, want setuid and devices kept", ctr, opts)
		}

		known := []string{
			filepath.Join(home, "layers", "image"),
			filepath.Join(home, "layers", "image", "diff"),
			filepath.Join(home, "layers", "ctr"),
			filepath.Join(home, "layers", "ctr", "diff"),
		}
		if layout == graph.LayoutHardlink {
			known = append(known, filepath.Join(home, "layers", "image", "root"))
		}
		for _, id := range []string{"image", "ctr"} {
			li, err := s.Layer(id)
			must(t, err)
			known = append(known, filepath.Join(home, "l", li.Link))
		}
		plan, err := json.Marshal(intrusion{Home: home, Dirs: known, Control: control, Disk: disk != 0, Inside: true})
		must(t, err)
		ctrRoot, err := os.Open(ctr)
		must(t, err)
		defer ctrRoot.Close()
		imgRoot, err := os.Open(img)
		must(t, err)
		defer imgRoot.Close()
		cmd := exec.Command(helper, "-test.run=^$")
		cmd.ExtraFiles = []*os.File{ctrRoot, imgRoot}
		cmd.Dir = control
		cmd.Env = []string{intruderEnv + "=" + string(plan)}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("intruder: %v: %s", err, stderr.String())
		}
		var rep intruderReport
		if err := json.Unmarshal(out, &rep); err != nil {
			t.Fatalf("intruder report %q: %v", out, err)
		}
		if rep.UID != nobody || rep.EUID != nobody {
			t.Fatalf("intruder ran as uid %d euid %d, want %d", rep.UID, rep.EUID, nobody)
		}
		// The intruder must have found both mounts where any user finds
		// them, or the test proves nothing about them.
		for _, mp := range []string{ctr, img} {
			if !slices.Contains(rep.Mounts, mp) {
				t.Errorf("intruder did not find the mount %s in mountinfo (found %v)", mp, rep.Mounts)
			}
		}
		judgeIntrusion(t, rep.Attempts)
	})
}

// judgeIntrusion fails the test for every control that failed and every
// attack that worked or failed for a reason other than a permission
// check.
func judgeIntrusion(t *testing.T, attempts []attempt) {
	t.Helper()
	denied := func(a attempt) bool {
		if a.Errno == int(unix.EACCES) || a.Errno == int(unix.EPERM) {
			return true
		}
		// Nothing to attack there, even for root: a layer without bin/
		// or tmp/. Once the store is closed to the intruder these are
		// EACCES too.
		target := a.Path
		if a.Op == "create" {
			target = filepath.Dir(target)
		}
		_, err := os.Lstat(target)
		return a.Errno == int(unix.ENOENT) && errors.Is(err, unix.ENOENT)
	}
	var attacks int
	for _, a := range attempts {
		switch a.Op {
		case "control-list", "control-open":
			if a.Err != "" {
				t.Errorf("control: %s %s as uid %d: %s (the guest, not the store, stops it)", a.Op, a.Path, nobody, a.Err)
			}
		case "control-exec":
			if a.Out != "euid=0" {
				t.Errorf("control: setuid-root %s as uid %d gave %q %s (want euid=0: setuid must work outside the store)", a.Path, nobody, a.Out, a.Err)
			}
		case "inside-ctr-exec":
			if a.Out != "euid=0" {
				t.Errorf("inside the container, setuid-root bin/suid gave %q %s, want euid=0 (a container keeps setuid)", a.Out, a.Err)
			}
		case "inside-ctr-open":
			if a.Err != "" {
				t.Errorf("inside the container, open dev/null: %s (a container keeps its devices)", a.Err)
			}
		case "inside-image-exec":
			attacks++
			if a.Err != "" || a.Out != fmt.Sprintf("euid=%d", nobody) {
				t.Errorf("inside the read-only image view, setuid-root bin/suid gave %q %s, want euid=%d (nosuid)", a.Out, a.Err, nobody)
			}
		case "inside-image-open":
			attacks++
			if a.Errno != int(unix.EACCES) {
				t.Errorf("inside the read-only image view, open dev/null: %q, want EACCES (nodev)", a.Err)
			}
		case "exec":
			attacks++
			switch {
			case a.Out == "euid=0":
				t.Errorf("uid %d ran setuid-root %s and got euid 0", nobody, a.Path)
			case a.Err == "" && strings.HasPrefix(a.Out, "euid="):
				// Ran without privilege (nosuid): the attack failed.
			case !denied(a):
				t.Errorf("uid %d exec %s: %s, want EACCES or EPERM", nobody, a.Path, a.Err)
			}
		default:
			attacks++
			if a.Err == "" {
				t.Errorf("uid %d could %s %s", nobody, a.Op, a.Path)
			} else if !denied(a) {
				t.Errorf("uid %d %s %s: %s, want EACCES or EPERM", nobody, a.Op, a.Path, a.Err)
			}
		}
	}
	if attacks == 0 {
		t.Error("the intruder attempted nothing")
	}
}

// TestOpenTightensStore: a store made with the old, searchable modes is
// locked down to its owner by the next Open, every layer directory
// included; a chmod that fails fails the Open with the path.
func TestOpenTightensStore(t *testing.T) {
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		home := filepath.Join(fs.Scratch(t, ""), "store")
		opts := graph.Options{Features: features(t, fs), Sync: graph.SyncNone}
		create := opts
		create.Create = true
		s, err := graph.Open(home, create)
		must(t, err)
		must(t, s.Create(context.Background(), "a", ""))
		must(t, s.CreateReadWrite(context.Background(), "b", "a"))
		must(t, s.Close())
		dirs := []string{home}
		for _, d := range []string{"layers", "l", "empty", "staging", "layers/a", "layers/b"} {
			dirs = append(dirs, filepath.Join(home, d))
		}
		for _, d := range dirs {
			must(t, os.Chmod(d, 0o711))
		}
		s2, err := graph.Open(home, opts)
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		must(t, s2.Close())
		for _, d := range dirs {
			fi, err := os.Lstat(d)
			must(t, err)
			if fi.Mode().Perm() != 0o700 {
				t.Errorf("%s: mode %v after Open, want 0700", d, fi.Mode().Perm())
			}
		}

		// An immutable layer directory cannot be chmodded, not even by
		// root: Open must say which one.
		victim := filepath.Join(home, "layers", "b")
		must(t, os.Chmod(victim, 0o755))
		guestfs.SetImmutable(t, victim, true)
		s3, err := graph.Open(home, opts)
		guestfs.SetImmutable(t, victim, false)
		if err == nil {
			s3.Close()
		}
		if err == nil || !strings.Contains(err.Error(), victim) {
			t.Errorf("Open with an immutable layer directory of mode 0755: %v, want an error naming %s", err, victim)
		}
		s4, err := graph.Open(home, opts)
		if err != nil {
			t.Fatalf("reopen after clearing the flag: %v", err)
		}
		must(t, s4.Close())
		fi, err := os.Lstat(victim)
		must(t, err)
		if fi.Mode().Perm() != 0o700 {
			t.Errorf("%s after Open: %v, want 0700", victim, fi.Mode().Perm())
		}
	})
}
