//go:build ovlkit_guest

package snapshottersuite

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/manager"
	"github.com/containerd/containerd/v2/cmd/containerd/command"
	ctrapp "github.com/containerd/containerd/v2/cmd/ctr/app"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

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

	// The runc shim's task service, for the shim this binary also is.
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task/plugin"
)

// The guest gets one binary per test package, so this one is also
// containerd, ctr and ovlsnapd: run with commandEnv set to one of those
// names, TestMain runs that command's own code (containerd's
// cmd/containerd/command, ctr's cmd/ctr/app, ovlsnapd's package daemon)
// with the binary's arguments instead of the tests, as a multi-call
// binary does.
const commandEnv = "OVLKIT_SNAPSHOTTER_COMMAND"

// It is also containerd's runc shim when its name is shimName:
// containerd finds the shim by that name on its PATH and starts it with
// its own environment, commandEnv included, and the shim starts itself
// again by os.Executable, so the name, not the environment, says that
// this is the shim.
const shimName = "containerd-shim-runc-v2"

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == shimName {
		shimPluginsOnly()
		// RunShim exits with 1 when it fails.
		shim.RunShim(context.Background(), manager.NewShimManager("io.containerd.runc.v2"))
		os.Exit(0)
	}
	if name := os.Getenv(commandEnv); name != "" {
		os.Exit(runCommand(name, os.Args))
	}
	os.Exit(m.Run())
}

// shimPluginsOnly leaves in the plugin registry only the shim's own
// plugins (those of pkg/shim and of the runc shim's command): the shim
// initialises every registered plugin, and containerd's, registered in
// this binary too, fail there.
func shimPluginsOnly() {
	keep := registry.Graph(func(r *plugin.Registration) bool {
		fn := runtime.FuncForPC(reflect.ValueOf(r.InitFn).Pointer())
		if fn == nil {
			return true
		}
		name := fn.Name()
		return !strings.HasPrefix(name, "github.com/containerd/containerd/v2/pkg/shim") &&
			!strings.HasPrefix(name, "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2")
	})
	registry.Reset()
	for i := range keep {
		registry.Register(&keep[i])
	}
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
