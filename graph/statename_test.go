package graph

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// A store whose state file still has its old name, in either format it
// had there, opens with its layers, and Open renames the file.
func TestOpenMigratesStateName(t *testing.T) {
	for _, format := range []string{"log", "single JSON"} {
		t.Run(format, func(t *testing.T) {
			home := t.TempDir()
			s := openTest(t, home, LayoutOverlay)
			if err := s.Create(context.Background(), "base", ""); err != nil {
				t.Fatal(err)
			}
			if err := s.CreateReadWrite(context.Background(), "ctr", "base"); err != nil {
				t.Fatal(err)
			}
			s.Close()
			legacy, current := filepath.Join(home, legacyStateName), filepath.Join(home, stateName)
			if format == "log" {
				if err := os.Rename(current, legacy); err != nil {
					t.Fatal(err)
				}
			} else {
				b, err := json.Marshal(mustLoad(t, &stateFile{path: current}))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(legacy, b, 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Remove(current); err != nil {
					t.Fatal(err)
				}
			}

			s2 := openTest(t, home, "")
			if _, err := os.Stat(legacy); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s after Open: %v, want it gone", legacyStateName, err)
			}
			if _, err := os.Stat(current); err != nil {
				t.Errorf("%s after Open: %v", stateName, err)
			}
			if li, err := s2.Layer("ctr"); err != nil || li.Parent != "base" {
				t.Errorf("layer ctr after migration: %+v, %v", li, err)
			}
			if probs, err := s2.Check(); err != nil || len(probs) > 0 {
				t.Errorf("check after migration: %v %v", probs, err)
			}
			if err := s2.Create(context.Background(), "more", "ctr"); err != nil {
				t.Errorf("create after migration: %v", err)
			}
		})
	}
}

// A state file under the new name wins: Open leaves one under the old
// name alone instead of replacing the current state with it.
func TestOpenKeepsCurrentStateOverLegacy(t *testing.T) {
	home := t.TempDir()
	s := openTest(t, home, LayoutOverlay)
	if err := s.Create(context.Background(), "base", ""); err != nil {
		t.Fatal(err)
	}
	s.Close()
	legacy := filepath.Join(home, legacyStateName)
	if err := os.WriteFile(legacy, []byte(`{"version":1,"layout":"overlay","layers":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := openTest(t, home, "")
	if !s2.Exists("base") {
		t.Error("layer base lost: the legacy state file replaced the current one")
	}
}
