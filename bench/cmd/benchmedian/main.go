// Command benchmedian reads `go test -json` events (as cmd/ovlvm -json
// writes them) or plain benchmark output on stdin and prints, for every
// benchmark and metric, the median over the runs (-count) and the number
// of runs, tab-separated, followed by the lowest and the highest value.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

func main() {
	rows, err := medians(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmedian:", err)
		os.Exit(1)
	}
	for _, r := range rows {
		fmt.Printf("%s\t%s\t%.6g\t%d\t%.6g\t%.6g\n", r.name, r.unit, r.median, r.runs, r.min, r.max)
	}
}

type row struct {
	name, unit       string
	median, min, max float64
	runs             int
}

// medians collects benchmark result lines. A line may arrive split over
// several output events (test2json flushes the name before the numbers),
// so output is reassembled per test before parsing.
func medians(r io.Reader) ([]row, error) {
	samples := map[[2]string][]float64{}
	var order [][2]string
	partial := map[string]string{}
	addLine := func(line string) {
		line = strings.TrimSpace(strings.ReplaceAll(line, "\r", ""))
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			return
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			return
		}
		name := f[0]
		// Strip the -GOMAXPROCS suffix so runs on different machines line up.
		if i := strings.LastIndex(name, "-"); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			k := [2]string{name, f[i+1]}
			if _, ok := samples[k]; !ok {
				order = append(order, k)
			}
			samples[k] = append(samples[k], v)
		}
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		text := sc.Text()
		var ev struct {
			Action, Test, Output string
		}
		if strings.HasPrefix(text, "{") && json.Unmarshal([]byte(text), &ev) == nil {
			if ev.Action != "output" {
				continue
			}
			buf := partial[ev.Test] + ev.Output
			for {
				i := strings.IndexByte(buf, '\n')
				if i < 0 {
					break
				}
				addLine(buf[:i])
				buf = buf[i+1:]
			}
			partial[ev.Test] = buf
			continue
		}
		addLine(text)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	for _, rest := range partial {
		addLine(rest)
	}
	rows := make([]row, 0, len(order))
	for _, k := range order {
		v := samples[k]
		sort.Float64s(v)
		m := v[len(v)/2]
		if len(v)%2 == 0 {
			m = (v[len(v)/2-1] + v[len(v)/2]) / 2
		}
		rows = append(rows, row{name: k[0], unit: k[1], median: m, runs: len(v), min: v[0], max: v[len(v)-1]})
	}
	return rows, nil
}
