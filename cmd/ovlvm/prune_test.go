package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// An xfstests run outlives a day, so that a part's sittings on several
// days can be judged together; other runs, and xfstests runs past a
// week, go.
func TestPruneRuns(t *testing.T) {
	cache := t.TempDir()
	age := map[string]time.Duration{
		"run-123":           25 * time.Hour,
		"run-456":           time.Hour,
		"run-xfstests-789":  3 * 24 * time.Hour,
		"run-xfstests-1011": 8 * 24 * time.Hour,
		"run-readers-1213":  25 * time.Hour,
		"linux-6.1":         30 * 24 * time.Hour,
	}
	for name, a := range age {
		d := filepath.Join(cache, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		mt := time.Now().Add(-a)
		if err := os.Chtimes(d, mt, mt); err != nil {
			t.Fatal(err)
		}
	}
	pruneRuns(cache)
	want := map[string]bool{"run-456": true, "run-xfstests-789": true, "linux-6.1": true}
	for name := range age {
		_, err := os.Stat(filepath.Join(cache, name))
		if kept := err == nil; kept != want[name] {
			t.Errorf("%s (%s old): kept %v, want %v", name, age[name], kept, want[name])
		}
	}
}
