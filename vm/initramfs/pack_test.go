package initramfs

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
