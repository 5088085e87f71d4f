//go:build ovlkit_guest

package snapshottersuite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// What TestContainerdRun needs besides the test binary, put into the
// guest by "ovlvm -file" (make containerd-run): a static runc,
// containerd's runc shim built from the same containerd module as the
// daemon, and the static program the image carries (./inimage).
const (
	runcPath = "/usr/local/bin/runc"
	// shimPath's directory goes on containerd's PATH: containerd finds
	// the shim by its name there.
	shimPath    = "/usr/local/bin/containerd-shim-runc-v2"
	inImagePath = "/usr/local/bin/ovlkit-inimage"
	// containersEnv set to "required" makes a kernel without what
	// containers need a failure instead of a skip.
	containersEnv = "OVLKIT_CONTAINERS"
	cgroupRoot    = "/sys/fs/cgroup"
	runImageBase  = "docker.io/ovlkit/run"
	runImageName  = runImageBase + ":1"
	containerID   = "ovlkit-run"
)

// The plugins ctr run needs, which containerd must refuse to start
// without: the task runtime and its shim manager, the containers and
// tasks services, and the ttrpc server the shims publish events to.
var runPlugins = []string{
	"io.containerd.runtime.v2.task",
	"io.containerd.shim.v1.manager",
	"io.containerd.grpc.v1.containers",
	"io.containerd.grpc.v1.tasks",
	"io.containerd.server.v1.ttrpc",
}

// A container run by the real containerd, its runc shim and runc, from an image ovlsnapd unpacked: ctr run
// --rm runs the static program of the image's top layer, which reports
// that it is PID 1 of its own PID namespace, that its root is an overlay
// mount, that it reads the files of the image's lower layers (one that
// only this run's image has), that a whited-out directory is absent, and
// that it can write into its root. Then nothing may be left: no task,
// container, shim, runc state, bundle, cgroup or mount, and once the
// image is removed, nothing in containerd or ovlsnapd either.
//
// The guest's default kernels have no namespaces or cgroups, and the
// initramfs no runc: the test skips there, unless containersEnv is
// "required" (make containerd-run, which boots kernels built with
// kconfig/containers.config), when it fails instead.
func TestContainerdRun(t *testing.T) {
	guesttest.Keeps(t, "ctr run starts a container from an image ovlsnapd unpacked, and removes it")
	if err := containersReady(t); err != nil {
		if os.Getenv(containersEnv) == "required" {
			t.Fatalf("%s=required: %v", containersEnv, err)
		}
		t.Skipf("%v (make containerd-run boots kernels and an initramfs that have them)", err)
	}
	t.Setenv("PATH", filepath.Dir(shimPath)+":"+os.Getenv("PATH"))
	prog, err := os.ReadFile(inImagePath)
	must(t, err)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		base := fs.Scratch(t, "")
		run, err := os.MkdirTemp("", "ctrd-")
		must(t, err)
		t.Cleanup(func() { os.RemoveAll(run) })
		state := filepath.Join(run, "state")
		runcRoot := filepath.Join(run, "runc")
		fifos := filepath.Join(run, "fifo")
		c := startContainerd(t, base, run, runPlugins, runConfig(filepath.Join(run, "s")))

		marker := fmt.Sprintf("only in image %s, run %d", fs.Name, time.Now().UnixNano())
		img, chain := writeImageOf(t, filepath.Join(base, "run.tar"), runImageLayers(prog, marker))
		c.ctr(t, "images", "import", "--base-name", runImageBase, "--snapshotter", proxyName, img)

		// --cpu-shares 0: ctr's default of 1024 takes the cpu controller,
		// which the kernel fragment leaves out.
		out := c.ctrWithin(t, 5*time.Minute, "run", "--rm", "--snapshotter", proxyName,
			"--no-pivot", "--cpu-shares", "0", "--runc-binary", runcPath, "--runc-root", runcRoot, "--fifo-dir", fifos,
			runImageName, containerID,
			"/bin/inimage", "-read", "/etc/marker", "-read", "/data/a", "-absent", "/gone",
			"-write", "/written=by the container")
		want := []string{
			"pid 1",
			"root overlay",
			fmt.Sprintf("read /etc/marker %q", marker),
			`read /data/a "a2"`,
			"absent /gone",
			"wrote /written",
		}
		if got := lines(out); !slices.Equal(got, want) {
			t.Fatalf("the container printed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}

		// ctr run --rm has deleted the task and the container, and
		// with it the container's snapshot from containerd's metadata.
		for _, what := range [][]string{{"tasks", "ls", "-q"}, {"containers", "ls", "-q"}} {
			if got := lines(c.ctr(t, what...)); len(got) > 0 {
				t.Errorf("ctr %s after ctr run --rm: %q", strings.Join(what, " "), got)
			}
		}
		image := map[string]string{}
		for _, id := range chain {
			image[id.String()] = "Committed"
		}
		if got := c.snapshots(t); !maps.Equal(got, image) {
			t.Errorf("snapshots after ctr run --rm: %v, want the image's %v", got, image)
		}
		checkNoShims(t)
		checkNoMounts(t, run)
		for _, dir := range []string{
			filepath.Join(state, "io.containerd.runtime.v2.task", "default"),
			filepath.Join(runcRoot, "default"),
			fifos,
		} {
			checkEmptyDir(t, dir)
		}
		if _, err := os.Stat(filepath.Join(cgroupRoot, "default", containerID)); !os.IsNotExist(err) {
			t.Errorf("the container's cgroup after ctr run --rm: %v, want it gone", err)
		}

		c.ctr(t, "images", "rm", "--sync", runImageName)
		c.checkNothingLeft(t, base)
	})
}

// runConfig is what containerd's configuration has for ctr run: the
// shims' sockets in socketDir, and the shims' timeouts, made generous for
// a guest under TCG on a busy host (containerd's are of a few seconds).
func runConfig(socketDir string) string {
	return fmt.Sprintf(`
[plugins."io.containerd.shim.v1.manager"]
  socket_dir = %q

[timeouts]
  "io.containerd.timeout.shim.load" = "1m"
  "io.containerd.timeout.shim.cleanup" = "1m"
  "io.containerd.timeout.shim.shutdown" = "1m"
  "io.containerd.timeout.task.state" = "30s"
`, socketDir)
}

// runImageLayers are the layers of the image ctr run runs: a marker
// file, a file changed by the next layer and a directory it whites out;
// then the program.
func runImageLayers(prog []byte, marker string) [][]tarEntry {
	return [][]tarEntry{
		{
			dir("etc"), file("etc/marker", 0o644, marker),
			dir("data"), file("data/a", 0o644, "a1"),
			dir("gone"), file("gone/file", 0o644, "g1"),
		},
		{
			dir("bin"), file("bin/inimage", 0o755, string(prog)),
			dir("data"), file("data/a", 0o644, "a2"),
			file(".wh.gone", 0o644, ""),
		},
	}
}

// containersReady returns why containers cannot run here, or nil: the
// kernel has the namespaces of containerd's default spec and cgroup v2
// (mounted at cgroupRoot for the rest of the test when it is not), and
// the guest has runc, the shim and the image's program.
func containersReady(t *testing.T) error {
	for _, ns := range []string{"pid", "ipc", "uts", "net", "mnt"} {
		if _, err := os.Stat("/proc/self/ns/" + ns); err != nil {
			return fmt.Errorf("the kernel has no %s namespaces: %w", ns, err)
		}
	}
	if err := mountCgroup2(t); err != nil {
		return err
	}
	for _, p := range []string{runcPath, shimPath, inImagePath} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("no %s in the guest (ovlvm -file puts it there): %w", filepath.Base(p), err)
		}
	}
	return nil
}

// mountCgroup2 mounts cgroup v2 at cgroupRoot unless it is there, and
// unmounts it when the test ends.
func mountCgroup2(t *testing.T) error {
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupRoot, &st); err != nil {
		return fmt.Errorf("the kernel has no cgroups (%s: %w)", cgroupRoot, err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return nil
	}
	if err := unix.Mount("cgroup2", cgroupRoot, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("the kernel has no cgroup v2: mount cgroup2 on %s: %w", cgroupRoot, err)
	}
	t.Cleanup(func() {
		// runc leaves the parent of the containers' cgroups, the one
		// of containerd's namespace.
		if err := os.Remove(filepath.Join(cgroupRoot, "default")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("remove the cgroup of containerd's namespace: %v", err)
		}
		if err := unix.Unmount(cgroupRoot, 0); err != nil {
			t.Errorf("unmount cgroup2 from %s: %v", cgroupRoot, err)
		}
	})
	return nil
}

// ctrWithin is ctr, killed and failing after d.
func (c *containerd) ctrWithin(t *testing.T, d time.Duration, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd, err := commandOf("ctr", append([]string{"--address", c.sock}, args...)...)
	must(t, err)
	killable := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	killable.Args[0] = cmd.Args[0]
	killable.Env = append(cmd.Env, "CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=1")
	var stdout, stderr bytes.Buffer
	killable.Stdout, killable.Stderr = &stdout, &stderr
	if err := killable.Run(); err != nil {
		t.Fatalf("ctr %s: %v (after %s: %v)\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err,
			d, ctx.Err(), stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes()
}

// checkNoShims fails when a runc shim is still running ten seconds after
// its task was deleted (it exits on its own once told to shut down).
func checkNoShims(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := shimPIDs(t)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("runc shims still running after ctr run --rm: PIDs %v", pids)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func shimPIDs(t *testing.T) []int {
	ents, err := os.ReadDir("/proc")
	must(t, err)
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue // gone meanwhile
		}
		argv0, _, _ := bytes.Cut(cmdline, []byte{0})
		if filepath.Base(string(argv0)) == filepath.Base(shimPath) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// checkEmptyDir fails when dir has entries; a directory that does not
// exist is empty.
func checkEmptyDir(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		t.Error(err)
		return
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) > 0 {
		t.Errorf("left in %s after ctr run --rm: %q", dir, names)
	}
}
