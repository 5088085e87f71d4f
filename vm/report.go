package vm

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
)

// WriteTable prints the summary of one or more runs: kernel, suite,
// filesystem, counts and time, then every failure with its output. The
// proves and keeps columns count the passing proof and keeps tests among
// the passed ones, so a reader sees that the keeps tests pass on both
// kernels and the proofs pass on the patched one (on the stock kernel the
// proofs are the expected failures).
func WriteTable(w io.Writer, results ...*Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "kernel\tsuite\tfs\tpassed\tfailed\tproves\tkeeps\texpected-fail\tskipped\ttime\t")
	for _, r := range results {
		for _, row := range Summarize(r.Tests) {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%.1fs\t\n", r.Label, row.Suite, row.FS,
				row.Passed, row.Failed, row.Proves, row.Keeps, row.Expected, row.Skips, row.Seconds)
		}
	}
	tw.Flush()
	for _, r := range results {
		for _, t := range r.Tests {
			if !t.Leaf && t.Status == Fail {
				continue // its failing subtests are listed
			}
			switch t.Status {
			case Fail:
				kind := ""
				if t.Kind == Kept {
					kind = " (a keeps test: it must pass on every kernel)"
				}
				fmt.Fprintf(w, "\nFAIL [%s] %s %s%s\n%s", r.Label, suiteName(t.Package), t.Name, kind, indent(t.Output))
			case UnexpectedPass:
				fmt.Fprintf(w, "\nFAIL [%s] %s %s: proves %q but passes on the stock kernel\n",
					r.Label, suiteName(t.Package), t.Name, strings.Join(t.Proves, "; "))
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
func WriteJSON(path string, results ...*Result) error {
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
func JUnit(results ...*Result) ([]byte, error) {
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
			s := suite(r.Label + "/" + suiteName(t.Package))
			c := junitCase{Name: t.Name, Classname: s.Name, Time: t.Elapsed}
			if t.Kind != Plain {
				c.Classname += "." + string(t.Kind)
			}
			switch t.Status {
			case Fail:
				c.Failure = &junitFailure{Message: "test failed", Body: t.Output}
			case UnexpectedPass:
				c.Failure = &junitFailure{Message: "proof test passes on the stock kernel", Body: t.Output}
			case Skip:
				c.Skipped = &struct{}{}
			case ExpectedFail:
				c.SystemOut = "fails on the stock kernel as its proof requires\n" + t.Output
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
			s := suite(r.Label + "/harness")
			s.Tests++
			s.Failures++
			first, _, _ := strings.Cut(p, "\n")
			s.Cases = append(s.Cases, junitCase{
				Name: fmt.Sprintf("problem-%d", i+1), Classname: s.Name,
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
func WriteJUnit(path string, results ...*Result) error {
	b, err := JUnit(results...)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write JUnit report: %w", err)
	}
	return nil
}
