package vm

import (
	"regexp"
	"strings"
)

// A Splat is a kernel report that means the kernel misbehaved, whatever the
// tests said: a WARN, BUG, Oops, panic, or a sanitizer or lockdep report.
type Splat struct {
	Kind    string   // what matched, e.g. "WARNING"
	Excerpt []string // the report, from its first line to its end marker
}

var splatStart = []struct {
	kind string
	re   *regexp.Regexp
}{
	{"WARNING", regexp.MustCompile(`WARNING: CPU: \d+ PID: \d+`)},
	{"BUG", regexp.MustCompile(`\bBUG: `)},
	{"Oops", regexp.MustCompile(`\bOops: `)},
	{"general protection fault", regexp.MustCompile(`general protection fault`)},
	{"Kernel panic", regexp.MustCompile(`Kernel panic - not syncing`)},
	{"KASAN", regexp.MustCompile(`\bKASAN: `)},
	{"UBSAN", regexp.MustCompile(`\bUBSAN: `)},
	{"lockdep", regexp.MustCompile(`WARNING: (possible circular locking|possible recursive locking|inconsistent lock state|suspicious RCU usage|bad unlock balance)`)},
	{"list corruption", regexp.MustCompile(`list_(add|del) corruption`)},
	{"hung task", regexp.MustCompile(`INFO: task .* blocked for more than`)},
}

var splatEnd = regexp.MustCompile(`---\[ end (trace|Kernel panic)`)

// maxExcerpt bounds a report whose end marker never came (the guest died).
const maxExcerpt = 60

// FindSplats scans kernel log lines for reports. Lines may carry console
// noise before the timestamp; matching is on substrings.
func FindSplats(lines []string) []Splat {
	var out []Splat
	for i := 0; i < len(lines); i++ {
		kind := ""
		for _, s := range splatStart {
			if s.re.MatchString(lines[i]) {
				kind = s.kind
				break
			}
		}
		if kind == "" {
			continue
		}
		// lockdep's header is a WARNING line too: prefer the precise kind.
		if kind == "WARNING" && strings.Contains(lines[i], "possible") {
			kind = "lockdep"
		}
		j := i
		for ; j < len(lines) && j-i < maxExcerpt; j++ {
			if j > i && splatEnd.MatchString(lines[j]) {
				break
			}
		}
		end := j + 1
		if end > len(lines) {
			end = len(lines)
		}
		out = append(out, Splat{Kind: kind, Excerpt: append([]string(nil), lines[i:end]...)})
		i = end - 1
	}
	return out
}
