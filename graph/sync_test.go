package graph

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// ApplyDiff with the default sync policy takes the syncfs path: the layer
// is published with its content, and staging is empty.
func TestApplyDiffSyncfs(t *testing.T) {
	home := t.TempDir()
	s, err := Open(home, Options{Create: true, Features: hostFeatures()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.sync != SyncFsync {
		t.Fatalf("default sync policy %q, want fsync", s.sync)
	}
	if err := s.Create(context.Background(), "base", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ApplyDiff(context.Background(), "base", tarOf(t, dir("d/"), reg("d/f", "content"))); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(s.diffDir("base"), "d", "f")); err != nil || string(b) != "content" {
		t.Errorf("published file: %q %v", b, err)
	}
	if ents, _ := os.ReadDir(filepath.Join(home, "staging")); len(ents) != 0 {
		t.Errorf("staging holds %d entries", len(ents))
	}
}

// A failed syncfs fails the apply: the error is not lost.
func TestSyncStageReportsErrors(t *testing.T) {
	err := syncStage(&stage{dir: "closed", fd: -1})
	if !errors.Is(err, unix.EBADF) {
		t.Errorf("syncfs of a bad descriptor: %v, want EBADF", err)
	}
}
