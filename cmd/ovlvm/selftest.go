package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/ovlkit/ovlkit/vm"
	"github.com/ovlkit/ovlkit/vm/report"
	"github.com/ovlkit/ovlkit/vm/verdict"
)

// A selftestCase is one boot with a deliberate fault (OVLKIT_INJECT, read
// by tests/guest/harness) and what the harness must make of it.
type selftestCase struct {
	name, inject string
	env          map[string]string
	want         func(*verdict.Result) error
}

// selftestCases are the faults the harness must report: none, a failing
// guest test, a kernel WARN (from lkdtm) in a run whose tests all pass, a
// kernel panic, and a test that hangs.
func selftestCases() []selftestCase {
	return []selftestCase{
		{"clean", "", nil, func(r *verdict.Result) error {
			if !r.OK() {
				return fmt.Errorf("clean run failed: %v", r.Problems)
			}
			return nil
		}},
		{"failing-test", "fail", nil, func(r *verdict.Result) error {
			if failedTest(r, "Injected") {
				return nil
			}
			return errors.New("a deliberately failing guest test was not reported as failed")
		}},
		{"kernel-warn", "warn", nil, func(r *verdict.Result) error {
			if !hasSplat(r, "WARNING") {
				return fmt.Errorf("an injected kernel WARN was not reported (problems: %v)", r.Problems)
			}
			if r.OK() {
				return errors.New("WARN found but the run still counts as passed")
			}
			return nil
		}},
		{"kernel-panic", "panic", nil, func(r *verdict.Result) error {
			if hasSplat(r, "Kernel panic") && !r.OK() {
				return nil
			}
			return fmt.Errorf("an injected kernel panic was not reported (problems: %v)", r.Problems)
		}},
		{"hanging-test", "hang", map[string]string{"OVLKIT_TEST_TIMEOUT": "5s"}, func(r *verdict.Result) error {
			if failedTest(r, "InjectedHang") {
				return nil
			}
			return fmt.Errorf("a hanging guest test was not reported as failed (problems: %v)", r.Problems)
		}},
	}
}

// failedTest reports whether a test whose name contains name failed.
func failedTest(r *verdict.Result, name string) bool {
	for _, t := range r.Tests {
		if t.Status == verdict.Fail && strings.Contains(t.Name, name) {
			return true
		}
	}
	return false
}

func hasSplat(r *verdict.Result, kind string) bool {
	for _, s := range r.Splats {
		if s.Kind == kind {
			return true
		}
	}
	return false
}

// env is the guest environment of the case's boot.
func (tc selftestCase) guestEnv() map[string]string {
	env := map[string]string{}
	for k, v := range tc.env {
		env[k] = v
	}
	if tc.inject != "" {
		env["OVLKIT_INJECT"] = tc.inject
	}
	return env
}

// cmdSelftest boots the kernel once per selftestCase and requires the
// harness to report each fault.
func cmdSelftest(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("selftest", flag.ExitOnError)
	var o options
	o.register(fs)
	kernelName := fs.String("kernel", "patched", "kernel to boot")
	fs.Parse(args)
	if len(o.pkgs) == 0 {
		o.pkgs = multiFlag{"./tests/guest/harness"}
	}
	h, kernel, err := kernelHarness(ctx, o, *kernelName)
	if err != nil {
		return err
	}
	var failures []string
	var results []*verdict.Result
	for _, tc := range selftestCases() {
		c, err := h.config("selftest-"+tc.name, kernel, false, tc.guestEnv())
		if err != nil {
			return err
		}
		res, err := vm.Run(ctx, c)
		if err != nil {
			return err
		}
		results = append(results, res)
		outcome := "ok"
		if err := tc.want(res); err != nil {
			outcome = "FAILED: " + err.Error()
			failures = append(failures, tc.name+": "+err.Error())
		}
		fmt.Printf("selftest %-13s run %-4s -> %s\n", tc.name, passFail(res.OK()), outcome)
		printReported(res)
	}
	if h.o.junit != "" {
		if err := report.WriteJUnit(h.o.junit, results...); err != nil {
			return err
		}
	}
	if len(failures) > 0 {
		return fmt.Errorf("harness self-test: %s", strings.Join(failures, "; "))
	}
	fmt.Println("harness self-test: a failing test, a kernel WARN, a kernel panic and a hanging test each fail the run")
	return nil
}

// printReported shows what the harness reported of a failed run, as a
// user would see it.
func printReported(res *verdict.Result) {
	if res.OK() {
		return
	}
	for _, p := range res.Problems {
		fmt.Printf("    reported: %s\n", strings.ReplaceAll(firstLines(p, 4), "\n", "\n    "))
	}
	for _, t := range res.Tests {
		if t.Status == verdict.Fail && t.Leaf {
			fmt.Printf("    reported: test %s failed\n", t.Name)
		}
	}
}
