// Package bench measures the ovlkit layer store and its tar layer code
// against their peers, moby's overlay2 graph driver and
// github.com/moby/go-archive, on the same input in the same guest boot.
//
// It is a module of its own so that the peers' dependency trees stay out
// of the project's go.mod. The benchmarks need root and an overlay-capable
// kernel: they carry the ovlkit_guest build tag and run inside the QEMU
// guest (see Documentation/benchmarks-graph.rst for how and what they
// measured). GenerateLayer builds on any host.
package bench
