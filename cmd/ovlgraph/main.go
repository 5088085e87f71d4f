// Command ovlgraph manages an ovlkit layer store.
//
//	ovlgraph --home DIR [--json] COMMAND [ARGS]
//
//	init [--layout overlay|hardlink] [--userxattr]
//	                                   create the store
//	create [--rw] [--parent P] ID      create an empty image (or, --rw, container) layer
//	apply ID < layer.tar[.gz|.zst]     fill an empty layer from a tar layer
//	mount [--volatile] ID              mount (reference-counted) and print the path
//	umount ID                          drop one reference, unmount at zero
//	diff ID > out.tar                  write the layer's changes as a tar layer
//	changes ID                         list added (A), changed (C), deleted (D) paths
//	rm ID                              remove a layer without children
//	ls                                 list the layers
//	status                             layout, backing filesystem, kernel features, mounts
//	check [--verify [--repair]] [ID]   verify the store's invariants, and with
//	                                   --verify every layer (or ID) against its
//	                                   manifest; --repair fixes what it finds
//
// Output is for people unless --json is given; errors go to stderr and
// the exit status is non-zero: 1 for a failure (check: a problem or a
// damaged layer remains), 2 for a command-line error, 3 when check
// --verify finds the store sound but layers reset by a repair waiting for
// their tar. In text output a name that holds a control
// character, a bidirectional control, a backslash, a double quote or bytes
// that are not UTF-8 is printed in double quotes with C escapes, as git
// prints paths, so that no name can forge a line or reach the terminal as
// an escape sequence; --json gives names exactly.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/ovlkit/ovlkit/graph"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env := &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, open: graph.Open}
	os.Exit(run(ctx, os.Args[1:], env))
}
