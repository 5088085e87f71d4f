// Package report writes judged runs out: a table a person reads, go test
// -json events and a JUnit report for CI, and reads a JUnit report back
// when the runs of several CI jobs are merged.
package report

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/ovlkit/ovlkit/vm/guestproto"
	"github.com/ovlkit/ovlkit/vm/verdict"
)

// WriteTable prints the summary of one or more runs: kernel, suite,
// filesystem, counts and time, then every failure with its output. The
// proves and keeps columns count the passing proof and keeps tests among
// the passed ones, so a reader sees that the keeps tests pass on both
// kernels and the proofs pass on the patched one (on the stock kernel the
// proofs are the expected failures).
func WriteTable(w io.Writer, results ...*verdict.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "kernel\tsuite\tfs\tpassed\tfailed\tproves\tkeeps\texpected-fail\tskipped\ttime\t")
	for _, r := range results {
		for _, row := range verdict.Summarize(r.Tests) {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%.1fs\t\n", r.Label, row.Suite, row.FS,
				row.Passed, row.Failed, row.Proves, row.Keeps, row.Expected, row.Skips, row.Seconds)
		}
	}
	tw.Flush()
	for _, r := range results {
		for _, t := range r.Tests {
			if !t.Leaf && t.Status == verdict.Fail {
				continue // its failing subtests are listed
			}
			switch t.Status {
			case verdict.Fail:
				kind := ""
				if t.Kind == verdict.Kept {
					kind = " (a keeps test: it must pass on every kernel)"
				}
				fmt.Fprintf(w, "\nFAIL [%s] %s %s%s\n%s", r.Label, verdict.SuiteName(t.Package), t.Name, kind, indent(t.Output))
			case verdict.UnexpectedPass:
				fmt.Fprintf(w, "\nFAIL [%s] %s %s: proves %q but passes on the stock kernel\n",
					r.Label, verdict.SuiteName(t.Package), t.Name, strings.Join(t.Proves, "; "))
			}
		}
		for _, p := range r.Problems {
			fmt.Fprintf(w, "\nFAIL [%s] %s\n", r.Label, p)
		}
	}
	fmt.Fprintln(w)
	for _, r := range results {
		verdict := "PASS"
		if !r.OK() {
			verdict = "FAIL"
		}
		if r.Serial == "" {
			fmt.Fprintf(w, "%s: %s\n", r.Label, verdict)
			continue
		}
		fmt.Fprintf(w, "%s: %s (%s, %.1fs in the guest; serial log %s)\n", r.Label, verdict, r.Uname, r.Seconds, r.Serial)
	}
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("    " + l + "\n")
	}
	return b.String()
}

// WriteJSON writes every run's go test -json events, one per line, with the
// kernel label prefixed to the package so runs stay apart.
func WriteJSON(path string, results ...*verdict.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	for _, r := range results {
		for _, e := range r.Events {
			e.Package = r.Label + ":" + e.Package
			if err := enc.Encode(e); err != nil {
				return err
			}
		}
	}
	return f.Close()
}

type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     float64     `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      float64       `xml:"time,attr"`
	Failure   *junitFailure `xml:"failure,omitempty"`
	Skipped   *struct{}     `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Body    string `xml:",chardata"`
}

// JUnit builds a JUnit report: one suite per kernel and package, one case
// per leaf test, and a "harness" case per run-level problem. The classname
// of a proof or keeps test ends in ".proves" or ".keeps", so a CI can tell
// the kinds apart in any JUnit schema.
func JUnit(results ...*verdict.Result) ([]byte, error) {
	var doc junitSuites
	for _, r := range results {
		suites := map[string]*junitSuite{}
		var order []string
		suite := func(name string) *junitSuite {
			s, ok := suites[name]
			if !ok {
				s = &junitSuite{Name: name}
				suites[name] = s
				order = append(order, name)
			}
			return s
		}
		for _, t := range r.Tests {
			if !t.Leaf {
				continue
			}
			s := suite(r.Label + "/" + verdict.SuiteName(t.Package))
			c := junitCase{Name: t.Name, Classname: s.Name, Time: t.Elapsed}
			if t.Kind != verdict.Plain {
				c.Classname += "." + string(t.Kind)
			}
			switch t.Status {
			case verdict.Fail:
				c.Failure = &junitFailure{Message: "test failed", Body: t.Output}
			case verdict.UnexpectedPass:
				c.Failure = &junitFailure{Message: junitUnexpectedPass, Body: t.Output}
			case verdict.Skip:
				c.Skipped = &struct{}{}
			case verdict.ExpectedFail:
				c.SystemOut = junitExpectedFail + t.Output
			}
			s.Tests++
			if c.Failure != nil {
				s.Failures++
			}
			if c.Skipped != nil {
				s.Skipped++
			}
			s.Time += t.Elapsed
			s.Cases = append(s.Cases, c)
		}
		for i, p := range r.Problems {
			s := suite(r.Label + "/" + junitHarnessSuite)
			s.Tests++
			s.Failures++
			first, _, _ := strings.Cut(p, "\n")
			s.Cases = append(s.Cases, junitCase{
				Name: fmt.Sprintf("%s%d", junitProblemPrefix, i+1), Classname: s.Name,
				Failure: &junitFailure{Message: first, Body: p},
			})
		}
		for _, n := range order {
			doc.Suites = append(doc.Suites, *suites[n])
		}
	}
	b, err := xml.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append([]byte(xml.Header), append(b, '\n')...), nil
}

// WriteJUnit writes the JUnit report of results to path.
func WriteJUnit(path string, results ...*verdict.Result) error {
	b, err := JUnit(results...)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write JUnit report: %w", err)
	}
	return nil
}

// What JUnit writes for the statuses a JUnit case cannot name; ReadJUnit
// reads them back.
const (
	junitUnexpectedPass = "proof test passes on the stock kernel"
	junitExpectedFail   = "fails on the stock kernel as its proof requires\n"
	junitHarnessSuite   = "harness"
	junitProblemPrefix  = "problem-"
)

// ReadJUnit reads a report JUnit wrote back into judged runs, keyed by
// their labels: every test's judged status and the run-level problems,
// which go test -json events do not hold. The runs have no events.
func ReadJUnit(data []byte) (map[string]*verdict.Result, error) {
	var doc junitSuites
	if err := xml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	runs := map[string]*verdict.Result{}
	for _, s := range doc.Suites {
		label, suite, ok := strings.Cut(s.Name, "/")
		if !ok {
			return nil, fmt.Errorf("suite %q is not named LABEL/SUITE", s.Name)
		}
		r := runs[label]
		if r == nil {
			r = &verdict.Result{Label: label}
			runs[label] = r
		}
		for _, c := range s.Cases {
			if suite == junitHarnessSuite && c.Classname == s.Name && strings.HasPrefix(c.Name, junitProblemPrefix) {
				// Go test names start with Test, Benchmark, Fuzz or
				// Example, so this is a run-level problem.
				if c.Failure == nil {
					return nil, fmt.Errorf("harness case %s without a failure", c.Name)
				}
				r.Problems = append(r.Problems, c.Failure.Body)
				continue
			}
			r.Tests = append(r.Tests, testFromJUnit(s.Name, suite, c))
		}
	}
	return runs, nil
}

// testFromJUnit turns a JUnit case back into the judged test JUnit made it
// from. The package is made so that suiteName gives the suite back.
func testFromJUnit(suiteFull, suite string, c junitCase) *verdict.Test {
	t := &verdict.Test{Package: "/tests/guest/" + suite, Name: c.Name, Elapsed: c.Time, Leaf: true}
	switch c.Classname {
	case suiteFull + "." + string(verdict.Proof):
		t.Kind = verdict.Proof
	case suiteFull + "." + string(verdict.Kept):
		t.Kind = verdict.Kept
	}
	switch {
	case c.Failure != nil:
		t.Action, t.Status, t.Output = "fail", verdict.Fail, c.Failure.Body
		if c.Failure.Message == junitUnexpectedPass {
			t.Action, t.Status = "pass", verdict.UnexpectedPass
		}
	case c.Skipped != nil:
		t.Action, t.Status = "skip", verdict.Skip
	case strings.HasPrefix(c.SystemOut, junitExpectedFail):
		t.Action, t.Status, t.Output = "fail", verdict.ExpectedFail, strings.TrimPrefix(c.SystemOut, junitExpectedFail)
	default:
		t.Action, t.Status = "pass", verdict.Pass
	}
	for _, line := range strings.Split(t.Output, "\n") {
		if i := strings.Index(line, guestproto.ProofMarker); i >= 0 {
			t.Proves = append(t.Proves, strings.TrimSpace(line[i+len(guestproto.ProofMarker):]))
		}
		if i := strings.Index(line, guestproto.KeepsMarker); i >= 0 {
			t.Keeps = append(t.Keeps, strings.TrimSpace(line[i+len(guestproto.KeepsMarker):]))
		}
	}
	return t
}
