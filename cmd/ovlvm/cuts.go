package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/ovlkit/ovlkit/vm"
)

// cmdCuts runs the hard-cut loop (vm.RunCuts): the store workload of
// tests/guest/cuts on persistent disks, QEMU killed at a seeded random
// moment, and every next boot checked against what was acknowledged.
func cmdCuts(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cuts", flag.ExitOnError)
	var o options
	o.register(fs)
	kernelName := fs.String("kernel", "patched", "kernel: stock, patched, a tree name or a bzImage path")
	count := fs.Int("count", 10, "cuts to make (each filesystem is cut at every one)")
	seed := fs.Uint64("seed", 0, "seed of the first cut (cut i uses seed+i); 0 picks one and prints it")
	maxDelay := fs.Duration("max-delay", 20*time.Second, "latest moment of a cut after the workloads began")
	keepGoing := fs.Bool("keep-going", false, "go on after a cut whose check failed")
	fs.Parse(args)
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["fs"] {
		o.fs = "ext4,xfs"
	}
	if !set["timeout"] {
		o.timeout = 10 * time.Minute
	}
	if len(o.pkgs) == 0 {
		o.pkgs = multiFlag{"./tests/guest/cuts"}
	}
	if *seed == 0 {
		*seed = 1 + rand.Uint64N(1<<31)
	}
	h, kernel, err := kernelHarness(ctx, o, *kernelName)
	if err != nil {
		return err
	}
	c, err := h.config("cuts", kernel, false, nil)
	if err != nil {
		return err
	}
	progress("cuts: seed %d: %d cuts on %s, each at most %s after the workloads began (reproduce: -seed %d -count %d)",
		*seed, *count, o.fs, *maxDelay, *seed, *count)
	res, err := vm.RunCuts(ctx, vm.CutsConfig{Config: c, Count: *count, Seed: *seed,
		MaxDelay: *maxDelay, KeepGoing: *keepGoing})
	if err != nil {
		return err
	}
	fmt.Println()
	vm.WriteCutsTable(os.Stdout, res)
	if !res.OK() {
		for _, f := range res.Failures {
			fmt.Println("FAIL", f)
		}
		return fmt.Errorf("cuts: %d failures (seed %d)", len(res.Failures), *seed)
	}
	if res.Cuts < *count {
		return fmt.Errorf("cuts: only %d of %d cuts made", res.Cuts, *count)
	}
	return nil
}
