//go:build ovlkit_guest

package snapshottersuite

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/containerd/containerd/v2/cmd/containerd/command"
	ctrapp "github.com/containerd/containerd/v2/cmd/ctr/app"

	"github.com/ovlkit/ovlkit/snapshotter/daemon"

	// The plugins this containerd is built with, named one by one instead
	// of containerd's cmd/containerd/builtins: the content store, bolt
	// metadata with leases and garbage collection, the walking differ, the
	// transfer service that ctr's image import uses, the gRPC services
	// ctr calls, and for ctr run the task runtime (runtime v2, which
	// starts a shim per container, with the mount manager it requires),
	// the containers and tasks services, and the ttrpc server the shims
	// publish their events to. Left out: the CRI, NRI, sandboxes,
	// metrics, and every built-in snapshotter, so that the only
	// snapshotter is the proxy plugin.
	_ "github.com/containerd/containerd/v2/core/runtime/v2"
	_ "github.com/containerd/containerd/v2/plugins/content/local/plugin"
	_ "github.com/containerd/containerd/v2/plugins/diff/walking/plugin"
	_ "github.com/containerd/containerd/v2/plugins/events"
	_ "github.com/containerd/containerd/v2/plugins/gc"
	_ "github.com/containerd/containerd/v2/plugins/imageverifier"
	_ "github.com/containerd/containerd/v2/plugins/leases"
	_ "github.com/containerd/containerd/v2/plugins/metadata"
	_ "github.com/containerd/containerd/v2/plugins/mount"
	_ "github.com/containerd/containerd/v2/plugins/server/grpc"
	_ "github.com/containerd/containerd/v2/plugins/server/ttrpc"
	_ "github.com/containerd/containerd/v2/plugins/services/containers"
	_ "github.com/containerd/containerd/v2/plugins/services/content"
	_ "github.com/containerd/containerd/v2/plugins/services/diff"
	_ "github.com/containerd/containerd/v2/plugins/services/events"
	_ "github.com/containerd/containerd/v2/plugins/services/healthcheck"
	_ "github.com/containerd/containerd/v2/plugins/services/images"
	_ "github.com/containerd/containerd/v2/plugins/services/introspection"
	_ "github.com/containerd/containerd/v2/plugins/services/leases"
	_ "github.com/containerd/containerd/v2/plugins/services/namespaces"
	_ "github.com/containerd/containerd/v2/plugins/services/snapshots"
	_ "github.com/containerd/containerd/v2/plugins/services/streaming"
	_ "github.com/containerd/containerd/v2/plugins/services/tasks"
	_ "github.com/containerd/containerd/v2/plugins/services/transfer"
	_ "github.com/containerd/containerd/v2/plugins/services/version"
	_ "github.com/containerd/containerd/v2/plugins/services/warning"
	_ "github.com/containerd/containerd/v2/plugins/streaming"
	_ "github.com/containerd/containerd/v2/plugins/transfer"
)

// The guest gets one binary per test package, so this one is also
// containerd, ctr and ovlsnapd: run with commandEnv set to one of those
// names, TestMain runs that command's own code (containerd's
// cmd/containerd/command, ctr's cmd/ctr/app, ovlsnapd's package daemon)
// with the binary's arguments instead of the tests, as a multi-call
// binary does.
const commandEnv = "OVLKIT_SNAPSHOTTER_COMMAND"

func TestMain(m *testing.M) {
	if name := os.Getenv(commandEnv); name != "" {
		os.Exit(runCommand(name, os.Args))
	}
	os.Exit(m.Run())
}

// runCommand runs the command name with args (args[0] is the program
// name) and returns its exit code.
func runCommand(name string, args []string) int {
	ctx := context.Background()
	var err error
	switch name {
	case "containerd":
		err = command.App().Run(ctx, args)
	case "ctr":
		err = ctrapp.New().Run(ctx, args)
	case "ovlsnapd":
		err = daemon.Main(args[1:])
	default:
		err = fmt.Errorf("no command %q in this binary", name)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}

// commandOf returns a command that runs this binary as name with args.
func commandOf(name string, args ...string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("this binary: %w", err)
	}
	cmd := exec.Command(self)
	cmd.Args = append([]string{name}, args...)
	cmd.Env = append(os.Environ(), commandEnv+"="+name)
	return cmd, nil
}
