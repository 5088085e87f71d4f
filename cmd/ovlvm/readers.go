package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ovlkit/ovlkit/vm"
)

// readerOptionSets are the overlay option sets whose mounts the real
// readers see: the series' new options alone and together, the ones it
// changes the handling of, and a mount with none. Both series (6.1 and
// 6.12) add strict_upper and strict_opaque; fsync= is the 6.1 series'
// and upstream's on 6.12, so the stock 6.1 kernel refuses it.
var readerOptionSets = []struct {
	mount string
	// show lists what findmnt must show, comma-separated; "a/b" takes
	// either. A volatile mount shows as "volatile" on stock 6.1 and as
	// "fsync=volatile" where fsync= exists (the 6.1 series, as upstream
	// does since fsync= came in); fsync=auto is the default and not shown.
	show string
}{
	{"", ""},
	{"strict_upper", "strict_upper"},
	{"strict_opaque", "strict_opaque"},
	{"fsync=auto", ""},
	{"fsync=strict", "fsync=strict"},
	{"fsync=volatile", "fsync=volatile"},
	{"volatile", "volatile/fsync=volatile"},
	{"strict_upper,strict_opaque,fsync=strict,redirect_dir=on,index=on,metacopy=on",
		"strict_upper,strict_opaque,fsync=strict,redirect_dir=on,index=on,metacopy=on"},
}

// cmdReaders reads what the kernel shows of overlays mounted with every
// new option through the programs people run, in the Debian guest on the
// stock and the patched kernel: findmnt (mountinfo), dmesg (kmsg) and
// trace-cmd (trace event formats). The Go readers (prometheus/procfs,
// moby/sys/mountinfo) run in the guest suite (tests/guest/abi).
//
// Any failing check fails the run, on either kernel; so does an option
// set that the patched kernel does not mount (on stock that is expected
// for the series' options and reported as not run).
func cmdReaders(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("readers", flag.ExitOnError)
	top := fs.String("C", ".", "ovlkit source tree")
	cache := fs.String("cache", defaultCache(), "cache directory (image, accelerator probe, run dirs)")
	kbase := fs.String("kbase", envOr("KBASE", defaultKBase), "kernel base: which linux-source trees stock and patched name")
	kernels := fs.String("kernel", "stock,patched", "kernels to run, comma-separated; the last is judged as the patched one")
	base := fs.String("fs", "ext4", "filesystem of the layers' disk: ext4 or xfs")
	image := fs.String("image", "", "root image (default: scripts/xfstests-image.sh builds or finds it, "+
		"without xfstests unless XFSTESTS is set)")
	accel := fs.String("accel", envOr("ACCEL", "auto"), "auto, kvm or tcg")
	timeout := fs.Duration("timeout", 20*time.Minute, "timeout for each VM")
	junit := fs.String("junit", "", "write a JUnit XML report here")
	verbose := fs.Bool("v", false, "show the guest consoles")
	fs.Parse(args)

	// The readers need Debian's userland, not xfstests: without an
	// XFSTESTS source of its own, the image is built without it.
	var imageEnv []string
	if os.Getenv("XFSTESTS") == "" {
		imageEnv = append(imageEnv, "XFSTESTS=none")
	}
	g, err := setupDebianGuest(ctx, *top, *cache, *kbase, *kernels, *image, *accel, imageEnv...)
	if err != nil {
		return err
	}
	pruneRuns(*cache)
	runRoot, err := os.MkdirTemp(*cache, "run-readers-")
	if err != nil {
		return err
	}
	var sets []string
	for _, o := range readerOptionSets {
		sets = append(sets, o.mount+"|"+o.show)
	}
	env := []string{"OPTION_SETS='" + strings.Join(sets, "\n") + "'"}
	res, err := g.run(ctx, *verbose, func(k guestKernel) vm.XfstestsConfig {
		return vm.XfstestsConfig{
			Image: g.image, FS: *base, Script: vm.ReadersGuestScript, Env: env,
			MemoryMB: 1024, Timeout: *timeout, WorkDir: filepath.Join(runRoot, k.name),
		}
	})
	if err != nil {
		return err
	}
	failures := reportReaders(os.Stdout, res)
	if *junit != "" {
		if err := vm.WriteXfstestsJUnit(*junit, res...); err != nil {
			return err
		}
		progress("JUnit report: %s", *junit)
	}
	if len(failures) > 0 {
		return fmt.Errorf("readers: %s", strings.Join(failures, "; "))
	}
	return nil
}

// reportReaders prints one line per check and kernel, and returns what
// fails the run.
func reportReaders(w io.Writer, res []*vm.XfstestsResult) []string {
	var failures []string
	fmt.Fprintf(w, "\nreal readers (findmnt, dmesg, trace-cmd)\n")
	for i, r := range res {
		patched := i == len(res)-1 && len(res) > 1
		p, f, n := r.Counts()
		fmt.Fprintf(w, "  %-8s %s: %d passed, %d failed, %d not run in %.0fs (serial log %s)\n",
			r.Label, r.Uname, p, f, n, r.Seconds, r.Serial)
		for _, pr := range r.Problems {
			fmt.Fprintf(w, "  PROBLEM [%s] %s\n", r.Label, strings.ReplaceAll(pr, "\n", "\n    "))
			failures = append(failures, fmt.Sprintf("%s: %s", r.Label, firstLines(pr, 1)))
		}
		for _, t := range r.Tests {
			fmt.Fprintf(w, "  %-8s %-28s %-6s %s\n", r.Label, t.Name, t.Status, t.Message)
			switch {
			case t.Status == vm.XfsFail:
				fmt.Fprintf(w, "    %s\n", strings.ReplaceAll(firstLines(t.Output, 40), "\n", "\n    "))
				failures = append(failures, fmt.Sprintf("%s fails on %s", t.Name, r.Label))
			case t.Status == vm.XfsNotRun && patched:
				failures = append(failures, fmt.Sprintf("%s not run on %s: %s", t.Name, r.Label, t.Message))
			}
		}
	}
	return failures
}
