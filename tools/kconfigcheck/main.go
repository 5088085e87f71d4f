// Command kconfigcheck fails when a kernel .config lost a symbol that one of
// the given fragments asked for. merge_config.sh only warns when Kconfig
// drops a value whose dependencies are not met; a guest kernel missing, say,
// CONFIG_XFS_FS would then fail much later and far less clearly.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// A value is what a config line says about one symbol: "y", "m", a string
// or number, or "" for "is not set".
type config map[string]string

// parse reads .config syntax: CONFIG_X=v and "# CONFIG_X is not set".
func parse(r io.Reader) (config, []string, error) {
	c := config{}
	var order []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		var sym, val string
		switch {
		case strings.HasPrefix(line, "# CONFIG_") && strings.HasSuffix(line, " is not set"):
			sym = strings.TrimSuffix(strings.TrimPrefix(line, "# "), " is not set")
		case strings.HasPrefix(line, "CONFIG_"):
			var ok bool
			sym, val, ok = strings.Cut(line, "=")
			if !ok {
				return nil, nil, fmt.Errorf("malformed line %q", line)
			}
		default:
			continue
		}
		if _, seen := c[sym]; !seen {
			order = append(order, sym)
		}
		c[sym] = val
	}
	return c, order, sc.Err()
}

func parseFile(path string) (config, []string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	c, order, err := parse(f)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, order, nil
}

// A mismatch is one requested symbol the final configuration does not hold.
type mismatch struct {
	fragment, symbol, want, got string
}

func (m mismatch) String() string {
	show := func(v string) string {
		if v == "" {
			return "not set"
		}
		return v
	}
	return fmt.Sprintf("%s: %s requested %s, final .config has %s (unmet dependency?)",
		m.fragment, m.symbol, show(m.want), show(m.got))
}

func check(final config, fragment string, want config, order []string) []mismatch {
	var out []mismatch
	for _, sym := range order {
		w := want[sym]
		g := final[sym]
		if w == "n" {
			w = ""
		}
		if w != g {
			out = append(out, mismatch{fragment, sym, w, g})
		}
	}
	return out
}

// present lists the requested symbols the final configuration holds as
// asked, one line each, for a log that shows what a build really checks.
func present(final config, fragment string, want config, order []string) []string {
	var out []string
	for _, sym := range order {
		w := want[sym]
		if w == "n" {
			w = ""
		}
		if final[sym] != w {
			continue
		}
		if w == "" {
			w = "not set"
		}
		out = append(out, fmt.Sprintf("%s: %s=%s present", fragment, sym, w))
	}
	return out
}

func main() {
	cfgPath := flag.String("config", ".config", "the merged kernel configuration")
	verbose := flag.Bool("v", false, "also list every requested symbol that survived")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: kconfigcheck -config .config fragment.config...")
		os.Exit(2)
	}
	final, _, err := parseFile(*cfgPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kconfigcheck:", err)
		os.Exit(2)
	}
	var all []mismatch
	for _, frag := range flag.Args() {
		want, order, err := parseFile(frag)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kconfigcheck:", err)
			os.Exit(2)
		}
		all = append(all, check(final, frag, want, order)...)
		if *verbose {
			for _, l := range present(final, frag, want, order) {
				fmt.Println("kconfigcheck:", l)
			}
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].fragment < all[j].fragment })
	for _, m := range all {
		fmt.Fprintln(os.Stderr, "kconfigcheck:", m)
	}
	if len(all) > 0 {
		os.Exit(1)
	}
}
