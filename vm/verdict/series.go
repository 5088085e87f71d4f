package verdict

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

var subjectRE = regexp.MustCompile(`^Subject:\s*(?:\[[^\]]*\]\s*)?(.*)$`)

// SeriesSubjects returns the subject line of every patch listed in the
// quilt series file of dir, so proof declarations can be checked against
// the patches that actually exist.
func SeriesSubjects(dir string) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "series"))
	if err != nil {
		return nil, fmt.Errorf("read series: %w", err)
	}
	subjects := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		p, err := os.ReadFile(filepath.Join(dir, f[0]))
		if err != nil {
			return nil, fmt.Errorf("series lists %s: %w", f[0], err)
		}
		lines := strings.Split(string(p), "\n")
		for i, l := range lines {
			m := subjectRE.FindStringSubmatch(l)
			if m == nil {
				continue
			}
			subj := m[1]
			// RFC 2822 folding: continuation lines start with whitespace.
			for j := i + 1; j < len(lines) && strings.HasPrefix(lines[j], " "); j++ {
				subj += lines[j]
			}
			subjects[strings.TrimSpace(subj)] = f[0]
			break
		}
	}
	return subjects, nil
}

// CheckProofs adds a problem for every proof declaration naming a patch the
// series does not have: a typo would otherwise prove nothing.
func (r *Result) CheckProofs(subjects map[string]string) {
	for _, t := range r.Tests {
		for _, p := range t.Proves {
			if _, ok := subjects[p]; !ok {
				r.Problems = append(r.Problems, fmt.Sprintf(
					"%s %s proves %q, which is not the subject of any patch in the series", SuiteName(t.Package), t.Name, p))
			}
		}
	}
}

// ProofScope is what the proof declarations of a run on one kernel base
// are checked against: the series of that base, and the subjects of the
// other bases' series, so that a proof of a patch one base has and another
// lacks is not taken for a typo on the second.
type ProofScope struct {
	Base     string
	Subjects map[string]string // subject -> patch file, patches/<Base>/series
	// Elsewhere maps a subject this base's series lacks to the bases
	// whose series have it.
	Elsewhere map[string][]string
}

// LoadProofScope reads patches/<base>/series and every other
// patches/*/series under dir.
func LoadProofScope(dir, base string) (*ProofScope, error) {
	subjects, err := SeriesSubjects(filepath.Join(dir, base))
	if err != nil {
		return nil, fmt.Errorf("series of kernel base %s: %w", base, err)
	}
	s := &ProofScope{Base: base, Subjects: subjects, Elsewhere: map[string][]string{}}
	others, err := filepath.Glob(filepath.Join(dir, "*", "series"))
	if err != nil {
		return nil, err
	}
	sort.Strings(others)
	for _, f := range others {
		other := filepath.Base(filepath.Dir(f))
		if other == base {
			continue
		}
		subj, err := SeriesSubjects(filepath.Dir(f))
		if err != nil {
			return nil, fmt.Errorf("series of kernel base %s: %w", other, err)
		}
		for p := range subj {
			if _, ok := subjects[p]; !ok {
				s.Elsewhere[p] = append(s.Elsewhere[p], other)
			}
		}
	}
	return s, nil
}

// ScopeProofs judges the proof declarations of r against the series of
// the base it ran on. A proof of a patch that only other bases' series have
// cannot fail on this base's stock kernel and pass on its patched one, as
// both lack the patch; the test is judged as a keeps test instead (it must
// pass on both kernels, or skip itself, which the table shows). A subject
// no series has stays a problem (CheckProofs). ScopeProofs returns the
// tests it turned into keeps tests.
func (r *Result) ScopeProofs(s *ProofScope) []*Test {
	var scoped []*Test
	for _, t := range r.Tests {
		var proves []string
		for _, p := range t.Proves {
			bases, elsewhere := s.Elsewhere[p]
			if !elsewhere {
				proves = append(proves, p)
				continue
			}
			t.Elsewhere = append(t.Elsewhere, p)
			t.Keeps = append(t.Keeps, fmt.Sprintf("what %q proves on %s (patches/%s lacks the patch)",
				p, strings.Join(bases, ", "), s.Base))
		}
		if len(proves) != len(t.Proves) {
			t.Proves = proves
			scoped = append(scoped, t)
		}
	}
	if len(scoped) > 0 {
		r.rejudge()
	}
	r.CheckProofs(s.Subjects)
	return scoped
}
