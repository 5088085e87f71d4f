package experiments

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// RSTTable formats a reStructuredText simple table, which also reads as a
// plain text table on a terminal. Every row must have len(header) cells.
func RSTTable(header []string, rows [][]string) (string, error) {
	width := make([]int, len(header))
	for i, h := range header {
		width[i] = utf8.RuneCountInString(h)
	}
	for n, r := range rows {
		if len(r) != len(header) {
			return "", fmt.Errorf("table row %d has %d cells, header %d", n, len(r), len(header))
		}
		for i, c := range r {
			if c == "" {
				// An empty first cell would continue the row above.
				return "", fmt.Errorf("table row %d cell %d is empty", n, i)
			}
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	var sb strings.Builder
	rule := func() {
		for i, w := range width {
			if i > 0 {
				sb.WriteString("  ")
			}
			sb.WriteString(strings.Repeat("=", w))
		}
		sb.WriteString("\n")
	}
	line := func(cells []string) {
		for i, c := range cells {
			if i > 0 {
				sb.WriteString("  ")
			}
			sb.WriteString(c)
			if i < len(cells)-1 {
				sb.WriteString(strings.Repeat(" ", width[i]-utf8.RuneCountInString(c)))
			}
		}
		sb.WriteString("\n")
	}
	rule()
	line(header)
	rule()
	for _, r := range rows {
		line(r)
	}
	rule()
	return sb.String(), nil
}

// Num formats v with three significant digits (more for large values).
func Num(v float64) string {
	switch a := abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

func abs(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}

// Spread formats a summary as "median (min–max)".
func Spread(s Summary) string {
	if s.N < 2 || s.Min == s.Max {
		return Num(s.Median)
	}
	return fmt.Sprintf("%s (%s–%s)", Num(s.Median), Num(s.Min), Num(s.Max))
}

// Bytes formats a size in bytes as KiB or MiB.
func Bytes(v float64) string {
	switch {
	case v >= 1<<20:
		return fmt.Sprintf("%.4g MiB", v/(1<<20))
	case v >= 1<<10:
		return fmt.Sprintf("%.4g KiB", v/(1<<10))
	default:
		return fmt.Sprintf("%g B", v)
	}
}
