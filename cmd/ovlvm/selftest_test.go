package main

import (
	"testing"

	"github.com/ovlkit/ovlkit/vm/verdict"
)

// Each self-test case accepts the run its fault should give and refuses a
// run in which the harness missed the fault.
func TestSelftestCasesJudge(t *testing.T) {
	clean := &verdict.Result{Tests: []*verdict.Test{{Name: "TestOK", Status: verdict.Pass, Leaf: true}}}
	failed := func(name string) *verdict.Result {
		return &verdict.Result{Tests: []*verdict.Test{{Name: name, Status: verdict.Fail, Leaf: true}}}
	}
	splat := func(kind string) *verdict.Result {
		return &verdict.Result{Splats: []verdict.Splat{{Kind: kind}}, Problems: []string{"kernel " + kind + " report"}}
	}
	caught := map[string]*verdict.Result{
		"clean":        clean,
		"failing-test": failed("TestInjectedFailure"),
		"kernel-warn":  splat("WARNING"),
		"kernel-panic": splat("Kernel panic"),
		"hanging-test": failed("TestInjectedHang"),
	}
	missed := map[string]*verdict.Result{
		"clean":        failed("TestOK"),
		"failing-test": clean,
		// A WARN the harness saw but did not fail the run for.
		"kernel-warn":  {Splats: []verdict.Splat{{Kind: "WARNING"}}},
		"kernel-panic": clean,
		"hanging-test": failed("TestInjectedFailure"),
	}
	cases := selftestCases()
	if len(cases) != len(caught) {
		t.Fatalf("%d cases, this test knows %d", len(cases), len(caught))
	}
	for _, tc := range cases {
		if err := tc.want(caught[tc.name]); err != nil {
			t.Errorf("%s: refused the run that shows its fault: %v", tc.name, err)
		}
		if err := tc.want(missed[tc.name]); err == nil {
			t.Errorf("%s: accepted a run in which the harness missed its fault", tc.name)
		}
	}
	if env := cases[4].guestEnv(); env["OVLKIT_INJECT"] != "hang" || env["OVLKIT_TEST_TIMEOUT"] != "5s" {
		t.Errorf("hanging-test environment %v", env)
	}
}
