package verdict

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/ovlkit/ovlkit/vm/guestproto"
)

// A Splat is a kernel report that means the kernel misbehaved, whatever the
// tests said: a WARN, BUG, Oops, panic, or a sanitizer or lockdep report.
type Splat struct {
	Kind    string   // what matched, e.g. "WARNING"
	Excerpt []string // the report, from its first line to its end marker
	// Test is the guest test that was running, "package Test/sub", from
	// the last test marker before the report ("" before the first test).
	Test string
}

// testMarker matches the kernel log line the guest writes when a test
// starts or resumes (initramfs/ovlinit).
var testMarker = regexp.MustCompile(regexp.QuoteMeta(guestproto.KmsgMarker) + `(\S+ \S+)`)

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
	// Every report header of kernel/locking/lockdep.c and of PROVE_RCU.
	{"lockdep", regexp.MustCompile(`WARNING: (possible circular locking|possible recursive locking|possible irq lock inversion|inconsistent lock state|suspicious RCU usage|bad unlock balance|bad contention|held lock freed|lock held when returning|Nested lock was not taken|chain_key collision|\S+-safe -> \S+-unsafe lock order|\S+/\d+ still has locks held)`)},
	{"list corruption", regexp.MustCompile(`list_(add|del) corruption`)},
	{"hung task", regexp.MustCompile(`INFO: task .* blocked for more than`)},
}

var splatEnd = regexp.MustCompile(`---\[ end (trace|Kernel panic)`)

// sanitizerEnd is the rule of '=' that closes a KASAN, KFENCE or UBSAN
// report (they have no end-trace line).
var sanitizerEnd = regexp.MustCompile(`={40,}`)

// maxExcerpt bounds a report whose end marker never came (the guest died).
const maxExcerpt = 60

// FindSplats scans kernel log lines for reports. Lines may carry console
// noise before the timestamp; matching is on substrings.
func FindSplats(lines []string) []Splat {
	var out []Splat
	test := ""
	for i := 0; i < len(lines); i++ {
		if m := testMarker.FindStringSubmatch(lines[i]); m != nil {
			test = m[1]
			continue
		}
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
		end := 0
		for ; j < len(lines) && j-i < maxExcerpt; j++ {
			if j == i {
				continue
			}
			if splatEnd.MatchString(lines[j]) || sanitizerEnd.MatchString(lines[j]) {
				end = j + 1
				break
			}
			// A report without an end line (lockdep's) is over when
			// the next test starts.
			if testMarker.MatchString(lines[j]) {
				end = j
				break
			}
		}
		if end == 0 {
			end = j
			if end > len(lines) {
				end = len(lines)
			}
		}
		out = append(out, Splat{Kind: kind, Excerpt: append([]string(nil), lines[i:end]...), Test: test})
		i = end - 1
	}
	return out
}

// lockdepOff matches the kernel's messages for turning lockdep off: its own
// "turning off the locking correctness validator" after a report or an
// overflow, and a taint that makes lock debugging unreliable (KASAN, BUG).
var lockdepOff = regexp.MustCompile(`turning off the locking correctness validator|Disabling lock debugging due to kernel taint`)

// LockdepOffCauses lists the kernel log lines that turned lockdep off, each
// with the test that was running, for a run whose guest found lockdep off
// at its end.
func LockdepOffCauses(lines []string) []string {
	var out []string
	test := ""
	for _, l := range lines {
		if m := testMarker.FindStringSubmatch(l); m != nil {
			test = m[1]
			continue
		}
		if lockdepOff.MatchString(l) {
			out = append(out, fmt.Sprintf("%s (while %s was running)", strings.TrimSpace(l), orNone(test)))
		}
	}
	return out
}

func orNone(test string) string {
	if test == "" {
		return "no test"
	}
	return test
}

// FindNewSplats finds the reports in lines that are not among known, and
// each of them once: the same report read from the serial console and
// from the kernel log counts once.
func FindNewSplats(known []Splat, lines []string) []Splat {
	seen := map[string]bool{}
	for _, s := range known {
		seen[splatKey(s)] = true
	}
	var found []Splat
	for _, s := range FindSplats(lines) {
		if k := splatKey(s); !seen[k] {
			seen[k] = true
			found = append(found, s)
		}
	}
	return found
}

// splatKey identifies a report by its kind and first line, without the
// timestamp, which the serial console and the kernel log print apart.
func splatKey(s Splat) string {
	first := s.Excerpt[0]
	if i := strings.Index(first, "] "); i >= 0 && strings.HasPrefix(strings.TrimSpace(first), "[") {
		first = first[i+2:]
	}
	return s.Kind + "\x00" + first
}

// Tail quotes the last n of lines, indented, the way problems quote a
// console.
func Tail(lines []string, n int) string {
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}
