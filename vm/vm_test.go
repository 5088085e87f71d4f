package vm

import (
	"os"
	"path/filepath"
	"testing"
)

func TestNestedWorkspace(t *testing.T) {
	top := t.TempDir()
	for _, f := range []string{"go.mod", "bench/go.mod", "bench/go.work", "other/go.mod"} {
		p := filepath.Join(top, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(top, "bench", "cmd", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		patterns []string
		want     string
		err      bool
	}{
		{[]string{"./tests/guest/..."}, "", false},
		{[]string{"./bench"}, filepath.Join(top, "bench", "go.work"), false},
		{[]string{"./bench/..."}, filepath.Join(top, "bench", "go.work"), false},
		{[]string{"./bench/cmd/x", "./tests/guest/graph"}, filepath.Join(top, "bench", "go.work"), false},
		{[]string{"./other"}, "", true},
	} {
		got, err := NestedWorkspace(top, c.patterns)
		if got != c.want || (err != nil) != c.err {
			t.Errorf("%v: %q, %v; want %q, error %v", c.patterns, got, err, c.want, c.err)
		}
	}
}

func TestParseTSCkHz(t *testing.T) {
	vmHost := "processor\t: 0\ncpu MHz\t\t: 2596.134\nflags\t\t: fpu tsc constant_tsc nonstop_tsc tsc_known_freq hypervisor\n" +
		"processor\t: 1\ncpu MHz\t\t: 1200.000\nflags\t\t: fpu\n"
	if khz, ok := parseTSCkHz(vmHost); !ok || khz != 2596134 {
		t.Errorf("VM host: %d %v, want 2596134", khz, ok)
	}
	for name, info := range map[string]string{
		"scaling bare metal": "cpu MHz\t\t: 3400.000\nflags\t\t: tsc constant_tsc nonstop_tsc\n",
		"no frequency":       "flags\t\t: tsc constant_tsc tsc_known_freq hypervisor\n",
		"empty":              "",
	} {
		if khz, ok := parseTSCkHz(info); ok {
			t.Errorf("%s: %d kHz, want none", name, khz)
		}
	}
}
