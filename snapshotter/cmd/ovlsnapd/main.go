// Command ovlsnapd serves an ovlkit layer store as a containerd proxy
// snapshotter: a gRPC server of containerd's snapshots API on a unix
// socket. Register it in containerd's config.toml:
//
//	[proxy_plugins.ovlkit]
//	  type = "snapshot"
//	  address = "/run/ovlsnapd.sock"
//
// Usage:
//
//	ovlsnapd [-root DIR] [-address SOCKET] [-strict-upper auto|on|off]
//	         [-fsync-strict] [-mount-option OPT]... [-async-remove] [-sync fsync|none]
//
// The daemon itself is package daemon.
package main

import (
	"fmt"
	"os"

	"github.com/ovlkit/ovlkit/snapshotter/daemon"
)

func main() {
	if err := daemon.Main(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ovlsnapd:", err)
		os.Exit(1)
	}
}
