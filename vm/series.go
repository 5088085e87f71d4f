package vm

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
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
					"%s %s proves %q, which is not the subject of any patch in the series", suiteName(t.Package), t.Name, p))
			}
		}
	}
}
