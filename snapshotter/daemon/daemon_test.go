package daemon

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/ovl"
	"github.com/ovlkit/ovlkit/snapshotter"
)

// The daemon's server on a real unix socket, with containerd's proxy
// client, as containerd's proxy_plugins connect: specs, commit, labels,
// walk and errors arrive intact. Nothing is mounted (the store's probe is
// replaced); the guest suite mounts.
func TestServeOverUnixSocket(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sn, err := snapshotter.Open(ctx, t.TempDir(), snapshotter.Config{Sync: graph.SyncNone,
		Features: &ovl.Features{DType: true, Whiteouts: true, Xattrs: true, Overlay: true, MultiLower: true, Notes: map[string]string{}}})
	if err != nil {
		t.Fatal(err)
	}
	defer sn.Close()
	sock := filepath.Join(t.TempDir(), "run", "ovlsnapd.sock")
	// What a killed daemon leaves: the socket file, nobody listening.
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, sn, sock, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "ovlkit")

	m, err := c.Prepare(ctx, "a", "", snapshots.WithLabels(map[string]string{"k": "v"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || m[0].Type != "overlay" || !slices.ContainsFunc(m[0].Options, func(o string) bool { return len(o) > 9 && o[:9] == "upperdir=" }) {
		t.Fatalf("mounts over the socket: %+v", m)
	}
	if err := c.Commit(ctx, "base", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Prepare(ctx, "b", "base", snapshots.WithLabels(map[string]string{"k": "v"})); err != nil {
		t.Fatal(err)
	}
	var names []string
	if err := c.Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		names = append(names, i.Name)
		return nil
	}, "labels.k==v"); err != nil {
		t.Fatal(err)
	}
	// Commit takes the labels of its options, not the active's.
	if !slices.Equal(names, []string{"b"}) {
		t.Errorf("walk labels.k==v over the socket: %v", names)
	}
	if err := c.Remove(ctx, "base"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("remove of a parent over the socket: %v, want FailedPrecondition", err)
	}
	if _, err := c.Mounts(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("mounts of a missing key: %v, want NotFound", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("serve after cancel: %v", err)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left after stop: %v", err)
	}
}
