// Command benchprofile reads `go test -json` events (as cmd/ovlvm -json
// writes them) on stdin and writes the CPU profiles that guest benchmarks
// logged as "pprof <name> <base64 chunk>" lines (BenchmarkApplyZstdProfile)
// to <dir>/<name>.pprof, for go tool pprof. The guest has no other way to
// hand files back.
package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	dir := flag.String("o", ".", "directory for the profiles")
	flag.Parse()
	profiles, err := collect(os.Stdin)
	if err == nil {
		err = write(*dir, profiles)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchprofile:", err)
		os.Exit(1)
	}
}

// collect joins each profile's chunks in the order they were logged. A
// benchmark's log line may arrive split over several output events, so
// output is reassembled per test before it is split into lines.
func collect(r io.Reader) (map[string]string, error) {
	text := map[string]*strings.Builder{}
	var order []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		var ev struct{ Action, Test, Output string }
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Action != "output" {
			continue
		}
		b, ok := text[ev.Test]
		if !ok {
			b = &strings.Builder{}
			text[ev.Test] = b
			order = append(order, ev.Test)
		}
		b.WriteString(ev.Output)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, t := range order {
		for _, line := range strings.Split(text[t].String(), "\n") {
			f := strings.Fields(line)
			// "file.go:NN: pprof <name> <chunk>" as testing logs it.
			for i := 0; i+2 < len(f); i++ {
				if f[i] == "pprof" {
					out[f[i+1]] += f[i+2]
					break
				}
			}
		}
	}
	return out, nil
}

func write(dir string, profiles map[string]string) error {
	if len(profiles) == 0 {
		return fmt.Errorf("no profiles in the input")
	}
	names := make([]string, 0, len(profiles))
	for n := range profiles {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		b, err := base64.StdEncoding.DecodeString(profiles[n])
		if err != nil {
			return fmt.Errorf("profile %s: %w", n, err)
		}
		p := filepath.Join(dir, n+".pprof")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
		fmt.Println(p)
	}
	return nil
}
