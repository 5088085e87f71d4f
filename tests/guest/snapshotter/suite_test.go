//go:build ovlkit_guest

// Package snapshottersuite runs containerd's own snapshotter test suite
// (core/snapshots/testsuite) against the ovlkit snapshotter on every
// upper filesystem of the guest: in process, and through the gRPC
// service that ovlsnapd serves, with containerd's proxy client.
package snapshottersuite

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/core/snapshots/testsuite"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/ovl"
	"github.com/ovlkit/ovlkit/snapshotter"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// probe runs the store's kernel probe once per filesystem, not once per
// snapshotter the suite opens.
func probe(t *testing.T, fs guesttest.FS) *ovl.Features {
	t.Helper()
	f, err := ovl.Probe(fs.Scratch(t, ""))
	if err != nil {
		t.Fatalf("probe %s: %v", fs.Name, err)
	}
	return &f
}

// scratch is a new directory on fs, on a tmpfs of 1 GiB for tmpfs.
func scratch(t testing.TB, fs guesttest.FS) string {
	if fs.Name == "tmpfs" {
		return fs.Scratch(t, "size=1g")
	}
	return fs.Scratch(t, "")
}

// opener opens a snapshotter in a new directory of base for each call of
// the suite, which runs its cases in parallel, each with its own.
func opener(base string, cfg snapshotter.Config) func(ctx context.Context) (*snapshotter.Snapshotter, func() error, error) {
	return func(ctx context.Context) (*snapshotter.Snapshotter, func() error, error) {
		dir, err := os.MkdirTemp(base, "sn-")
		if err != nil {
			return nil, nil, err
		}
		sn, err := snapshotter.Open(ctx, dir, cfg)
		if err != nil {
			return nil, nil, err
		}
		return sn, func() error {
			return errors.Join(sn.Close(), os.RemoveAll(dir))
		}, nil
	}
}

// The suite as containerd runs it for its overlay snapshotter (under the
// name "overlayfs", which leaves out the rename of a lower directory),
// calling the snapshotter in process.
func TestContainerdSuite(t *testing.T) {
	guesttest.Keeps(t, "containerd's snapshotter suite passes on the ovlkit store")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		open := opener(scratch(t, fs), snapshotter.Config{Features: probe(t, fs), Sync: graph.SyncNone})
		testsuite.SnapshotterSuite(t, "overlayfs", func(ctx context.Context, _ string) (snapshots.Snapshotter, func() error, error) {
			return open(ctx)
		})
	})
}

// The suite through the gRPC service ovlsnapd serves and containerd's
// proxy client, as containerd talks to a proxy plugin, under a name of its own
// so that Rename also renames a directory of a lower layer: the store
// mounts with redirect_dir=on (Config.MountOptions) for it.
func TestContainerdSuiteOverGRPC(t *testing.T) {
	guesttest.Keeps(t, "containerd's snapshotter suite passes through the proxy plugin API")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		open := opener(scratch(t, fs), snapshotter.Config{Features: probe(t, fs), Sync: graph.SyncNone,
			MountOptions: []string{"redirect_dir=on"}})
		testsuite.SnapshotterSuite(t, "ovlkit", func(ctx context.Context, _ string) (snapshots.Snapshotter, func() error, error) {
			sn, closeSn, err := open(ctx)
			if err != nil {
				return nil, nil, err
			}
			// The connection is in memory, the rest is the gRPC
			// server and client containerd and ovlsnapd use; the
			// unix socket containerd dials is TestContainerdDaemon's.
			l := bufconn.Listen(1 << 20)
			rpc := grpc.NewServer()
			snapshotsapi.RegisterSnapshotsServer(rpc, snapshotservice.FromSnapshotter(sn))
			go rpc.Serve(l)
			conn, err := grpc.NewClient("passthrough:///ovlsnapd",
				grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }),
				grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				rpc.Stop()
				return nil, nil, errors.Join(err, closeSn())
			}
			return proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "ovlkit"), func() error {
				cerr := conn.Close()
				rpc.GracefulStop()
				return errors.Join(cerr, closeSn())
			}, nil
		})
	})
}

// mountOptions are the super block options of the overlay mounted at
// target.
func mountOptions(t *testing.T, target string) string {
	t.Helper()
	e := guesttest.OverlayEntry(t, target)
	return e.VFSOptions + "," + e.Options
}

// seriesMount prepares a snapshot with cfg, mounts it as containerd
// would, and returns the options the kernel shows for it.
func seriesMount(t *testing.T, fs guesttest.FS, cfg snapshotter.Config) string {
	ctx := context.Background()
	cfg.Features = probe(t, fs)
	sn, err := snapshotter.Open(ctx, filepath.Join(scratch(t, fs), "sn"), cfg)
	must(t, err)
	defer sn.Close()
	m, err := sn.Prepare(ctx, "a", "")
	must(t, err)
	target := t.TempDir()
	must(t, mount.All(m, target))
	opts := mountOptions(t, target)
	must(t, mount.UnmountAll(target, 0))
	must(t, sn.Remove(ctx, "a"))
	return opts
}

// strict_upper reaches the mounts containerd makes from the specs, and
// on is refused on a kernel without it.
func TestStrictUpperOption(t *testing.T) {
	guesttest.Proves(t, "ovl: add strict_upper option to fail instead of degrading")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		if opts := seriesMount(t, fs, snapshotter.Config{StrictUpper: graph.FeatureOn}); !strings.Contains(opts, "strict_upper") {
			t.Errorf("snapshot mount options %q lack strict_upper", opts)
		}
		if opts := seriesMount(t, fs, snapshotter.Config{StrictUpper: graph.FeatureOff}); strings.Contains(opts, "strict_upper") {
			t.Errorf("strict_upper off, and the mount has it: %q", opts)
		}
	})
}

// fsync=strict reaches the mounts of active snapshots.
func TestFsyncStrictOption(t *testing.T) {
	guesttest.Proves(t, "ovl: add fsync=auto|strict|volatile mount option")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		if opts := seriesMount(t, fs, snapshotter.Config{FsyncStrict: true}); !strings.Contains(opts, "fsync=strict") {
			t.Errorf("snapshot mount options %q lack fsync=strict", opts)
		}
	})
}
