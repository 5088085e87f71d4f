package verdict

import (
	"fmt"
	"os"
	"strings"

	"github.com/ovlkit/ovlkit/vm/guestproto"
)

// Result is a judged guest run.
type Result struct {
	Label    string
	Uname    string
	Tests    []*Test
	Events   []Event
	Splats   []Splat
	Problems []string // run-level failures, each a sentence
	Seconds  float64
	Serial   string // path of the serial log
	Kmsg     []string
}

// OK reports whether the run passed: every test judged pass, skip or
// expected-fail, and no run-level problem.
func (r *Result) OK() bool {
	if len(r.Problems) > 0 {
		return false
	}
	for _, t := range r.Tests {
		switch t.Status {
		case Pass, Skip, ExpectedFail:
		default:
			return false
		}
	}
	return true
}

// Judging says how to judge one guest run.
type Judging struct {
	GoBin string // go, for test2json
	// Stock marks the unpatched kernel: proof tests must fail there.
	Stock bool
	// ExpectTests: test binaries were packed, so a run in which no test
	// ran is a problem.
	ExpectTests bool
}

// JudgeGuest reads what the guest sent over the results console (the file
// at resultsPath, which a guest that never reached its test runner did not
// write) and its serial console, and decides what passed. An error means
// the results could not be read; what went wrong in the guest is in r.
func (r *Result) JudgeGuest(resultsPath string, console []string, j Judging) error {
	f, err := os.Open(resultsPath)
	if err != nil {
		r.Problems = append(r.Problems, fmt.Sprintf(
			"guest sent no results (the kernel never reached the test runner?); last console lines:\n%s",
			Tail(console, 25)))
		r.Splats = FindSplats(console)
		return nil
	}
	defer f.Close()
	g, err := guestproto.Parse(f)
	if err != nil {
		return err
	}
	r.Uname = g.Kernel
	r.Kmsg = g.Kmsg
	for _, b := range g.Binaries {
		evs, err := toEvents(j.GoBin, b.Pkg, b.Output)
		if err != nil {
			return err
		}
		r.Events = append(r.Events, evs...)
		switch {
		case !b.Ended:
			r.Problems = append(r.Problems, fmt.Sprintf("%s: test binary did not finish (guest died?)", b.Pkg))
		case b.ExitCode != 0 && !hasFailure(evs):
			r.Problems = append(r.Problems, fmt.Sprintf("%s: test binary exited %d without reporting a failed test (a panic or its -test.timeout):\n%s",
				b.Pkg, b.ExitCode, Tail(strings.Split(string(b.Output), "\n"), 20)))
		}
	}
	for _, n := range g.Notes {
		if strings.Contains(n, "exit status") || strings.Contains(n, "signal") {
			continue // already reported through the binary's exit code
		}
		if strings.HasPrefix(n, "lockdep: turned off") {
			// Say what turned it off, and during which test.
			causes := LockdepOffCauses(g.Kmsg)
			if len(causes) == 0 {
				causes = LockdepOffCauses(console)
			}
			if len(causes) > 0 {
				n += "; turned off by:\n    " + strings.Join(causes, "\n    ")
			}
		}
		r.Problems = append(r.Problems, "guest: "+n)
	}
	if !g.Done {
		r.Problems = append(r.Problems, fmt.Sprintf(
			"guest did not complete its run (panic or hang?); last console lines:\n%s", Tail(console, 25)))
	}
	for _, set := range [][]string{g.Kmsg, console} {
		r.Splats = append(r.Splats, FindNewSplats(r.Splats, set)...)
	}
	for _, s := range r.Splats {
		r.Problems = append(r.Problems, fmt.Sprintf("kernel %s report while %s was running:\n%s",
			s.Kind, orNone(s.Test), strings.Join(s.Excerpt, "\n")))
	}
	r.Tests = collectTests(r.Events)
	r.Problems = append(r.Problems, judgeTests(r.Tests, j.Stock)...)
	if len(r.Tests) == 0 && j.ExpectTests && len(r.Problems) == 0 {
		r.Problems = append(r.Problems, "no test ran (does the -run pattern match anything?)")
	}
	return nil
}

func hasFailure(evs []Event) bool {
	for _, e := range evs {
		if e.Action == "fail" && e.Test != "" {
			return true
		}
	}
	return false
}
