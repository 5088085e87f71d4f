// Package daemon is ovlsnapd: its flags, the snapshotter it opens and the
// gRPC server of containerd's snapshots API it serves on a unix socket.
// Command ovlsnapd is Main; a program that needs the daemon as one of its
// own commands (the guest test that runs containerd, ctr and ovlsnapd
// from one binary) calls Main too, so both are the same code.
package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"google.golang.org/grpc"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/snapshotter"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// Main runs the daemon with args (the command line without the program
// name) until SIGINT or SIGTERM.
func Main(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return Run(ctx, args)
}

// Run runs the daemon with args until ctx ends.
func Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("ovlsnapd", flag.ContinueOnError)
	root := fs.String("root", "/var/lib/ovlsnapd", "directory of the metadata and the layer store")
	address := fs.String("address", "/run/ovlsnapd.sock", "unix socket to serve on")
	strict := fs.String("strict-upper", "auto", "mount with the series' strict_upper: auto (where the kernel has it), on, off")
	fsyncStrict := fs.Bool("fsync-strict", false, "mount container snapshots with the series' fsync=strict (the kernel must have it)")
	var mountOpts listFlag
	fs.Var(&mountOpts, "mount-option", "overlay option for every mount, e.g. redirect_dir=on (repeatable)")
	async := fs.Bool("async-remove", false, "Remove drops metadata only; Cleanup removes the layers")
	sync := fs.String("sync", string(graph.SyncFsync), "durability of new layers: fsync or none")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	use := graph.FeatureUse(*strict)
	if use == "auto" {
		use = graph.FeatureAuto
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	sn, err := snapshotter.Open(ctx, *root, snapshotter.Config{
		StrictUpper: use, FsyncStrict: *fsyncStrict, MountOptions: mountOpts,
		Sync: graph.SyncPolicy(*sync), AsyncRemove: *async, Logger: log,
	})
	if err != nil {
		return err
	}
	defer sn.Close()

	st, err := sn.Store().Status()
	if err != nil {
		return err
	}
	log.Info("ovlsnapd starting", "address", *address, "root", *root, "backing_fs", st.BackingFS,
		"mount_options", strings.Join(st.MountOpts, ","), "missing", strings.Join(st.Missing, "; "))
	return Serve(ctx, sn, *address, nil)
}

// Serve serves sn on the unix socket address until ctx ends, replacing a
// socket left by an earlier run; ready, when set, is called once it
// listens.
func Serve(ctx context.Context, sn *snapshotter.Snapshotter, address string, ready func()) error {
	if err := os.MkdirAll(filepath.Dir(address), 0o700); err != nil {
		return fmt.Errorf("socket directory: %w", err)
	}
	if err := os.Remove(address); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	l, err := net.Listen("unix", address)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer os.Remove(address)
	rpc := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(rpc, snapshotservice.FromSnapshotter(sn))
	errc := make(chan error, 1)
	go func() { errc <- rpc.Serve(l) }()
	if ready != nil {
		ready()
	}
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
		rpc.GracefulStop()
		return nil
	}
}
