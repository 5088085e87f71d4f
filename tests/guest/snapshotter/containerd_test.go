//go:build ovlkit_guest

package snapshottersuite

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ovlkit/ovlkit/snapshotter"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// The name ctr and containerd's transfer service know the proxy
// snapshotter by, and the image the test imports.
const (
	proxyName = "ovlkit"
	imageBase = "docker.io/ovlkit/layers"
	imageName = imageBase + ":1"
)

// A real containerd daemon and the real ctr, with ovlsnapd registered
// through proxy_plugins, on each upper filesystem: ctr imports a
// generated three-layer OCI image (whiteouts of a file and a directory,
// an opaque directory, a file whiteout in a lower and re-created above)
// and containerd's transfer service unpacks it into ovlsnapd; ctr
// prepares a container snapshot, the test mounts what ctr printed, reads
// the image's tree and writes into it; ctr commits it, diffs it with
// containerd's diff service, views it; then ctr removes every snapshot,
// the content and the image. Nothing may be left: no mount, no layer in
// the store, no snapshot in ovlsnapd's metadata or containerd's, no blob.
func TestContainerdDaemon(t *testing.T) {
	guesttest.Keeps(t, "containerd and ctr unpack, mount, commit, diff and remove an image through ovlsnapd")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		base := fs.Scratch(t, "")
		// Sockets go to a short path of their own: a unix socket's
		// path is limited to 107 bytes.
		run, err := os.MkdirTemp("", "ctrd-")
		must(t, err)
		t.Cleanup(func() { os.RemoveAll(run) })
		c := startContainerd(t, base, run, nil, "")
		kept := c.exercise(t, base)
		c.removeAll(t, kept)
		c.checkNothingLeft(t, base)
	})
}

// containerd is one ovlsnapd and one containerd using it.
type containerd struct {
	snapRoot, snapSock string
	root, sock         string
	snapd, ctrd        *proc
}

// startContainerd starts ovlsnapd over a store on base and containerd
// with its root on base too (its content, its metadata, its temporary
// mounts) and its sockets in run, and waits until ctr reaches it.
// containerd refuses to start without the plugins required lists beyond
// those of containerdConfig; extra is more of its configuration.
func startContainerd(t *testing.T, base, run string, required []string, extra string) *containerd {
	c := &containerd{
		snapRoot: filepath.Join(base, "ovlsnapd"),
		snapSock: filepath.Join(run, "ovlsnapd.sock"),
		root:     filepath.Join(base, "containerd"),
		sock:     filepath.Join(run, "containerd.sock"),
	}
	c.snapd = startDaemon(t, "ovlsnapd", filepath.Join(run, "ovlsnapd.log"),
		"-root", c.snapRoot, "-address", c.snapSock)
	c.snapd.waitFor(t, "its socket", func() error { _, err := os.Stat(c.snapSock); return err })

	config := filepath.Join(run, "config.toml")
	must(t, os.WriteFile(config, []byte(containerdConfig(c.root, filepath.Join(run, "state"), c.snapSock, required)+extra), 0o644))
	c.ctrd = startDaemon(t, "containerd", filepath.Join(run, "containerd.log"),
		"--config", config, "--address", c.sock)
	c.ctrd.waitFor(t, "ctr plugins ls", func() error {
		_, err := c.tryCtr("plugins", "ls")
		return err
	})
	return c
}

// containerdConfig is containerd's config.toml: root and state, ovlsnapd
// as a proxy snapshotter, and the transfer service (which ctr's image
// import goes through) told to unpack into it. There is no other
// snapshotter in this containerd, so without unpack_config the transfer
// service would look for overlayfs and fail to start. The required
// plugins make containerd refuse to start without them, rather than
// fail later at the first call.
func containerdConfig(root, state, snapSock string, required []string) string {
	var more strings.Builder
	for _, r := range required {
		fmt.Fprintf(&more, "  %q,\n", r)
	}
	return fmt.Sprintf(`version = 4
root = %q
state = %q
required_plugins = [
  "io.containerd.snapshotter.v1.%[4]s",
  "io.containerd.differ.v1.walking",
  "io.containerd.transfer.v1.local",
  "io.containerd.grpc.v1.transfer",
  "io.containerd.grpc.v1.snapshots",
  "io.containerd.grpc.v1.diff",
%[5]s]

[proxy_plugins.%[4]s]
  type = "snapshot"
  address = %[3]q

[[plugins."io.containerd.transfer.v1.local".unpack_config]]
  platform = "linux/amd64"
  snapshotter = "%[4]s"
`, root, state, snapSock, proxyName, more.String())
}

// exercise is the life of an image and a container snapshot, through
// ctr. It returns the digest of the diff it kept in the content store.
func (c *containerd) exercise(t *testing.T, base string) digest.Digest {
	img, chain := writeImage(t, filepath.Join(base, "image.tar"))
	// ctr's default import goes through containerd's transfer service,
	// which unpacks in the daemon.
	c.ctr(t, "images", "import", "--base-name", imageBase, "--snapshotter", proxyName, img)
	if got := lines(c.ctr(t, "images", "ls", "-q")); !slices.Equal(got, []string{imageName}) {
		t.Fatalf("images after import: %q, want %q", got, imageName)
	}
	snaps := c.snapshots(t)
	want := map[string]string{}
	for _, id := range chain {
		want[id.String()] = "Committed"
	}
	if !maps.Equal(snaps, want) {
		t.Fatalf("snapshots after unpack: %v, want the image's chain %v", snaps, want)
	}
	top := chain[len(chain)-1].String()

	// A container's snapshot: prepared by ctr, mounted from the mounts
	// it printed with containerd's mount package, as a runtime does.
	work := t.TempDir()
	ms := c.mounts(t, c.ctr(t, "snapshots", "--snapshotter", proxyName, "prepare", "--mounts", "work", top))
	must(t, mount.All(ms, work))
	checkTree(t, "the container's mount", work, imageTree)
	must(t, os.WriteFile(filepath.Join(work, "opaque/new2"), []byte("new2"), 0o644))
	must(t, os.WriteFile(filepath.Join(work, "data/b"), []byte("b-container"), 0o644))
	must(t, os.Remove(filepath.Join(work, "data/c")))
	must(t, os.Mkdir(filepath.Join(work, "newdir"), 0o755))
	must(t, os.WriteFile(filepath.Join(work, "newdir/f"), []byte("f"), 0o644))
	checkTree(t, "the container's mount after its writes", work, containerTree)
	must(t, mount.UnmountAll(work, 0))

	c.ctr(t, "snapshots", "--snapshotter", proxyName, "commit", "committed", "work")
	want = map[string]string{"committed": "Committed"}
	maps.Copy(want, snaps)
	if got := c.snapshots(t); !maps.Equal(got, want) {
		t.Fatalf("snapshots after commit: %v, want %v", got, want)
	}

	// The diff service compares the committed snapshot with its parent
	// (views of both, mounted by containerd), writes the layer to the
	// content store, kept there (--keep), and ctr prints it.
	layer := c.ctr(t, "snapshots", "--snapshotter", proxyName, "diff", "--keep", "committed")
	checkDiff(t, layer)
	kept := digest.FromBytes(layer)

	// A read-only view of it: the container's tree, not writable. ctr
	// makes a view with no lease and no gc.root label (prepare and
	// commit label theirs), which containerd's next garbage collection
	// removes from its metadata but not from the children its parent
	// lists (containerd issue 11908): the parent could then never be
	// removed. So the test first waits for a collection, leaving none
	// pending (containerd collects only after a deletion or many
	// changes), and then labels the view a root at once.
	c.collectGarbage(t)
	view := t.TempDir()
	ms = c.mounts(t, c.ctr(t, "snapshots", "--snapshotter", proxyName, "view", "--mounts", "cview", "committed"))
	c.ctr(t, "snapshots", "--snapshotter", proxyName, "label", "cview", "containerd.io/gc.root="+time.Now().UTC().Format(time.RFC3339))
	must(t, mount.All(ms, view))
	checkTree(t, "a view of the committed container", view, containerTree)
	if err := os.WriteFile(filepath.Join(view, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write into a view: %v, want EROFS", err)
	}
	must(t, mount.UnmountAll(view, 0))
	return kept
}

// removeAll removes, with ctr, the container's snapshots (the view,
// then what it views), the diff kept in the content store, and the
// image. containerd removes a snapshot from its own metadata at once and
// from the snapshotter at its next garbage collection, which image
// removal with --sync runs before it returns: that collection removes the
// image's snapshots (in both) and blobs, which nothing references any
// more.
func (c *containerd) removeAll(t *testing.T, kept digest.Digest) {
	image := c.snapshots(t)
	delete(image, "committed")
	delete(image, "cview")
	c.removeSnapshot(t, "cview")
	c.removeSnapshot(t, "committed")
	if got := c.snapshots(t); !maps.Equal(got, image) {
		t.Errorf("snapshots after removing the container's: %v, want the image's %v", got, image)
	}
	if blobs := lines(c.ctr(t, "content", "ls", "-q")); !slices.Contains(blobs, kept.String()) {
		t.Errorf("the kept diff %s is not in the content store: %q", kept, blobs)
	}
	c.ctr(t, "content", "rm", kept.String())
	if blobs := lines(c.ctr(t, "content", "ls", "-q")); slices.Contains(blobs, kept.String()) {
		t.Errorf("the kept diff %s is still in the content store after ctr content rm", kept)
	}
	c.ctr(t, "images", "rm", "--sync", imageName)
}

// removeSnapshot removes key with ctr, failing with ctr's tree of
// snapshots and its leases when it cannot.
func (c *containerd) removeSnapshot(t *testing.T, key string) {
	t.Helper()
	if _, err := c.tryCtr("snapshots", "--snapshotter", proxyName, "rm", key); err != nil {
		tree, _ := c.tryCtr("snapshots", "--snapshotter", proxyName, "tree")
		leases, _ := c.tryCtr("leases", "ls")
		t.Fatalf("ctr snapshots rm %s: %v\nsnapshots:\n%sleases:\n%s", key, err, tree, leases)
	}
}

// collectGarbage makes containerd collect garbage and waits for it: ctr
// has no command for that, but a lease removed with --sync waits for a
// collection.
func (c *containerd) collectGarbage(t *testing.T) {
	t.Helper()
	id := lines(c.ctr(t, "leases", "create"))
	if len(id) != 1 {
		t.Fatalf("ctr leases create printed %q, want one lease", id)
	}
	c.ctr(t, "leases", "rm", "--sync", id[0])
}

// checkNothingLeft asserts that ctr sees no image, snapshot, blob or
// lease, ovlsnapd no snapshot, the guest no mount of either daemon, and,
// once both have stopped, the store no layer and its metadata no
// snapshot, with nothing for reconciliation to do when it opens again.
func (c *containerd) checkNothingLeft(t *testing.T, base string) {
	for _, what := range [][]string{{"images", "ls", "-q"}, {"content", "ls", "-q"}, {"leases", "ls", "-q"}} {
		if got := lines(c.ctr(t, what...)); len(got) > 0 {
			t.Errorf("ctr %s after removing everything: %q", strings.Join(what, " "), got)
		}
	}
	if got := c.snapshots(t); len(got) > 0 {
		t.Errorf("ctr snapshots ls after removing everything: %v", got)
	}
	if got := c.backendSnapshots(t); len(got) > 0 {
		t.Errorf("ovlsnapd still has snapshots %v", got)
	}
	blobs, err := os.ReadDir(filepath.Join(c.root, "io.containerd.content.v1.content", "blobs", "sha256"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Error(err)
	}
	if len(blobs) > 0 {
		t.Errorf("%d blobs left in containerd's content store", len(blobs))
	}
	c.ctrd.stop(t)
	c.snapd.stop(t)
	checkNoMounts(t, base, c.root)

	sn, err := snapshotter.Open(context.Background(), c.snapRoot, snapshotter.Config{})
	must(t, err)
	defer sn.Close()
	// Open reconciled already; a second pass must find nothing either.
	rep, err := sn.Reconcile(context.Background())
	must(t, err)
	if !reflectEmpty(rep) {
		t.Errorf("reconciliation after containerd removed everything: %+v", rep)
	}
	must(t, sn.Walk(context.Background(), func(_ context.Context, i snapshots.Info) error {
		t.Errorf("snapshot %q left in ovlsnapd's metadata", i.Name)
		return nil
	}))
	layers, err := sn.Store().Layers()
	must(t, err)
	for _, l := range layers {
		t.Errorf("layer %s left in the store (holds %v)", l.ID, l.Holds)
	}
	problems, err := sn.Store().Check()
	must(t, err)
	for _, p := range problems {
		t.Errorf("store check: %v", p)
	}
}

func reflectEmpty(r snapshotter.Report) bool {
	return len(r.Snapshots)+len(r.Layers)+len(r.Released)+len(r.Restored)+len(r.Frozen) == 0
}

// checkNoMounts fails for any overlay mount and any mount beneath dirs.
func checkNoMounts(t *testing.T, dirs ...string) {
	t.Helper()
	infos, err := mountinfo.GetMounts(nil)
	must(t, err)
	for _, m := range infos {
		beneath := slices.ContainsFunc(dirs, func(d string) bool { return strings.HasPrefix(m.Mountpoint, d+"/") })
		if m.FSType == "overlay" || beneath {
			t.Errorf("mount left behind: %s on %s (%s, %s)", m.Source, m.Mountpoint, m.FSType, m.VFSOptions)
		}
	}
}

// backendSnapshots are the snapshots ovlsnapd itself has, asked over its
// socket with containerd's proxy client, as containerd asks.
func (c *containerd) backendSnapshots(t *testing.T) []string {
	conn, err := grpc.NewClient("unix://"+c.snapSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	must(t, err)
	defer conn.Close()
	var names []string
	sn := proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), proxyName)
	must(t, sn.Walk(context.Background(), func(_ context.Context, i snapshots.Info) error {
		names = append(names, i.Name)
		return nil
	}))
	return names
}

// snapshots are ctr's snapshots of the proxy snapshotter: key to kind.
func (c *containerd) snapshots(t *testing.T) map[string]string {
	got := map[string]string{}
	for i, l := range lines(c.ctr(t, "snapshots", "--snapshotter", proxyName, "ls")) {
		f := strings.Fields(l)
		if i == 0 || len(f) < 2 {
			continue // the header
		}
		got[f[0]] = f[len(f)-1]
	}
	return got
}

// mounts parses the mounts ctr printed with --mounts.
func (c *containerd) mounts(t *testing.T, out []byte) []mount.Mount {
	t.Helper()
	var ms []mount.Mount
	if err := json.Unmarshal(out, &ms); err != nil || len(ms) == 0 {
		t.Fatalf("mounts printed by ctr: %v\n%s", err, out)
	}
	return ms
}

// ctr runs ctr against the daemon and returns its standard output.
func (c *containerd) ctr(t *testing.T, args ...string) []byte {
	t.Helper()
	out, err := c.tryCtr(args...)
	if err != nil {
		t.Fatalf("ctr %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func (c *containerd) tryCtr(args ...string) ([]byte, error) {
	cmd, err := commandOf("ctr", append([]string{"--address", c.sock}, args...)...)
	if err != nil {
		return nil, err
	}
	// ctr checks the daemon for deprecations before each command, with
	// the introspection service's Server call, which reads the daemon's
	// /proc/PID/ns/pid: the guest kernel has no namespaces, so the
	// check fails (with a warning), and so does ctr version.
	cmd.Env = append(cmd.Env, "CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

func lines(b []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// proc is a long-running command of this binary, its output in a file
// that the test log gets when the test fails.
type proc struct {
	name, logPath string
	cmd           *exec.Cmd
	exited        chan struct{}
	err           error
	stopOnce      sync.Once
}

func startDaemon(t *testing.T, name, logPath string, args ...string) *proc {
	t.Helper()
	f, err := os.Create(logPath)
	must(t, err)
	cmd, err := commandOf(name, args...)
	must(t, err)
	d := &proc{name: name, logPath: logPath, cmd: cmd, exited: make(chan struct{})}
	d.cmd.Stdout, d.cmd.Stderr = f, f
	if err := d.cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		d.err = d.cmd.Wait()
		f.Close()
		close(d.exited)
	}()
	t.Cleanup(func() {
		d.stop(t)
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 16<<10 {
				b = b[len(b)-16<<10:]
			}
			t.Logf("%s's log (its end):\n%s", name, b)
		}
	})
	return d
}

// waitFor waits until ready succeeds, failing when the daemon exits or a
// minute passes.
func (d *proc) waitFor(t *testing.T, what string, ready func() error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		err := ready()
		if err == nil {
			return
		}
		select {
		case <-d.exited:
			t.Fatalf("%s exited before %s: %v", d.name, what, d.err)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %s after a minute: %v", d.name, what, err)
		}
	}
}

// stop ends the daemon with SIGTERM, as a service manager does, and
// fails unless it exits cleanly within a minute.
func (d *proc) stop(t *testing.T) {
	d.stopOnce.Do(func() {
		select {
		case <-d.exited:
			t.Errorf("%s exited on its own: %v", d.name, d.err)
			return
		default:
		}
		if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Errorf("stop %s: %v", d.name, err)
		}
		select {
		case <-d.exited:
			if d.err != nil {
				t.Errorf("%s after SIGTERM: %v", d.name, d.err)
			}
		case <-time.After(time.Minute):
			d.cmd.Process.Kill()
			<-d.exited
			t.Errorf("%s did not stop within a minute of SIGTERM", d.name)
		}
	})
}

// The image: three layers over each other. Each file's content names
// the layer it comes from.
var imageLayers = [][]tarEntry{
	{
		dir("bin"), file("bin/tool", 0o755, "tool v1"),
		dir("data"), file("data/a", 0o644, "a1"), file("data/b", 0o644, "b1"),
		dir("dir"), dir("dir/keep"), file("dir/keep/x", 0o644, "x1"),
		dir("etc"), file("etc/hostname", 0o644, "one\n"),
		dir("gone"), file("gone/file", 0o644, "g1"),
		dir("opaque"), file("opaque/old1", 0o644, "old1"), dir("opaque/sub"), file("opaque/sub/old2", 0o644, "old2"),
		symlink("link", "etc/hostname"),
	},
	{
		dir("data"), file("data/.wh.a", 0o644, ""), file("data/c", 0o644, "c2"),
		dir("etc"), file("etc/hostname", 0o644, "two\n"),
		file(".wh.gone", 0o644, ""),
		dir("opaque"), file("opaque/.wh..wh..opq", 0o644, ""), file("opaque/new1", 0o644, "new1"),
	},
	{
		dir("data"), file("data/a", 0o644, "a3"),
		dir("dir"), dir("dir/keep"), file("dir/keep/.wh.x", 0o644, ""),
		file("l3", 0o644, "three"),
	},
}

// imageTree is what the image's top layer shows: data/a whited out and
// made again, dir/keep/x whited out, gone/ whited out, opaque/ hiding
// the first layer's entries.
var imageTree = map[string]string{
	"bin": "d 755", "bin/tool": "f 755 tool v1",
	"data": "d 755", "data/a": "f 644 a3", "data/b": "f 644 b1", "data/c": "f 644 c2",
	"dir": "d 755", "dir/keep": "d 755",
	"etc": "d 755", "etc/hostname": "f 644 two\n",
	"l3":     "f 644 three",
	"link":   "l etc/hostname",
	"opaque": "d 755", "opaque/new1": "f 644 new1",
}

// containerTree is imageTree after the container's writes.
var containerTree = func() map[string]string {
	m := maps.Clone(imageTree)
	delete(m, "data/c")
	m["data/b"] = "f 644 b-container"
	m["opaque/new2"] = "f 644 new2"
	m["newdir"] = "d 755"
	m["newdir/f"] = "f 644 f"
	return m
}()

type tarEntry struct {
	hdr  tar.Header
	body string
}

func dir(name string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755}}
}

func file(name string, mode int64, body string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body))}, body: body}
}

func symlink(name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}

func tarOf(t *testing.T, entries []tarEntry) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		h.Format = tar.FormatPAX
		h.ModTime = time.Unix(1700000000, 0)
		must(t, tw.WriteHeader(&h))
		_, err := io.WriteString(tw, e.body)
		must(t, err)
	}
	must(t, tw.Close())
	return buf.Bytes()
}

// writeImage writes the image as an OCI image layout tar at path (the
// first layer gzip-compressed, the others not) and returns the path and
// the chain IDs of its layers, which containerd names the snapshots by.
func writeImage(t *testing.T, path string) (string, []digest.Digest) {
	return writeImageOf(t, path, imageLayers)
}

// writeImageOf is writeImage for an image of the layers given, bottom
// first, tagged "1" too.
func writeImageOf(t *testing.T, path string, imageLayers [][]tarEntry) (string, []digest.Digest) {
	blobs := map[digest.Digest][]byte{}
	add := func(b []byte) digest.Digest {
		d := digest.FromBytes(b)
		blobs[d] = b
		return d
	}
	var diffIDs []digest.Digest
	var layers []ocispec.Descriptor
	for i, entries := range imageLayers {
		raw := tarOf(t, entries)
		diffIDs = append(diffIDs, digest.FromBytes(raw))
		blob, mediaType := raw, ocispec.MediaTypeImageLayer
		if i == 0 {
			var z bytes.Buffer
			zw := gzip.NewWriter(&z)
			_, err := zw.Write(raw)
			must(t, err)
			must(t, zw.Close())
			blob, mediaType = z.Bytes(), ocispec.MediaTypeImageLayerGzip
		}
		layers = append(layers, ocispec.Descriptor{MediaType: mediaType, Digest: add(blob), Size: int64(len(blob))})
	}
	platform := ocispec.Platform{OS: "linux", Architecture: "amd64"}
	config := jsonOf(t, ocispec.Image{Platform: platform, RootFS: ocispec.RootFS{Type: "layers", DiffIDs: diffIDs}})
	manifest := jsonOf(t, ocispec.Manifest{
		Versioned: specsVersion, MediaType: ocispec.MediaTypeImageManifest,
		Config: ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: add(config), Size: int64(len(config))},
		Layers: layers,
	})
	index := jsonOf(t, ocispec.Index{Versioned: specsVersion, MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{{
			MediaType: ocispec.MediaTypeImageManifest, Digest: add(manifest), Size: int64(len(manifest)),
			Platform:    &platform,
			Annotations: map[string]string{ocispec.AnnotationRefName: "1"},
		}}})

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	put := func(name string, b []byte) {
		must(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(b))}))
		_, err := tw.Write(b)
		must(t, err)
	}
	put(ocispec.ImageLayoutFile, jsonOf(t, ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion}))
	put(ocispec.ImageIndexFile, index)
	for _, d := range slices.Sorted(maps.Keys(blobs)) {
		put("blobs/sha256/"+d.Encoded(), blobs[d])
	}
	must(t, tw.Close())
	must(t, os.WriteFile(path, buf.Bytes(), 0o644))
	return path, identity.ChainIDs(diffIDs)
}

var specsVersion = specs.Versioned{SchemaVersion: 2}

func jsonOf(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	must(t, err)
	return b
}

// treeOf describes every entry beneath root: "d PERM" for a directory,
// "f PERM CONTENT" for a regular file, "l TARGET" for a symlink, and
// "other MODE" for anything else (a whiteout showing through would be a
// character device).
func treeOf(t *testing.T, root string) map[string]string {
	t.Helper()
	got := map[string]string{}
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := e.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.IsDir():
			got[rel] = fmt.Sprintf("d %o", fi.Mode().Perm())
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			got[rel] = fmt.Sprintf("f %o %s", fi.Mode().Perm(), b)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			got[rel] = "l " + target
		default:
			got[rel] = fmt.Sprintf("other %v", fi.Mode())
		}
		return nil
	})
	must(t, err)
	return got
}

func checkTree(t *testing.T, what, root string, want map[string]string) {
	t.Helper()
	got := treeOf(t, root)
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got[k] != want[k] {
			t.Errorf("%s: %s is %q, want %q", what, k, got[k], want[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: unexpected %s (%q)", what, k, got[k])
		}
	}
}

// checkDiff checks the layer ctr printed for the committed container
// against its parent: the writes, the removal as a whiteout, and of the
// directories at most those that changed.
func checkDiff(t *testing.T, layer []byte) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(layer))
	if err != nil {
		t.Fatalf("the diff ctr printed is not gzip (%d bytes): %v", len(layer), err)
	}
	files := map[string]string{}
	var dirs []string
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(t, err)
		name := strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		if h.Typeflag == tar.TypeDir {
			dirs = append(dirs, name)
			continue
		}
		b, err := io.ReadAll(tr)
		must(t, err)
		files[name] = fmt.Sprintf("%c %s", h.Typeflag, b)
	}
	want := map[string]string{
		"data/.wh.c":  "0 ",
		"data/b":      "0 b-container",
		"newdir/f":    "0 f",
		"opaque/new2": "0 new2",
	}
	if !maps.Equal(files, want) {
		t.Errorf("diff of the committed container: files %q, want %q", files, want)
	}
	for _, d := range dirs {
		if !slices.Contains([]string{"data", "newdir", "opaque"}, d) {
			t.Errorf("diff of the committed container has directory %q, which did not change", d)
		}
	}
	if !slices.Contains(dirs, "newdir") {
		t.Errorf("diff of the committed container lacks the new directory: %q", dirs)
	}
}
