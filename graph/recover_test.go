package graph

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestRecoveryUndoesUnrecordedApply: a power cut between the exchange
// that publishes an apply's content (durable with the fsync of layers/)
// and the state record that makes the layer applied leaves the record
// saying empty over a directory that holds the content and its manifest.
// The dm-log-writes replay of the store (tests/guest/crash) finds that
// state. Open puts the layer back to empty, so it verifies and its tar
// applies again, and leaves a container layer's own files alone.
func TestRecoveryUndoesUnrecordedApply(t *testing.T) {
	ctx := context.Background()
	for _, layout := range []Layout{LayoutOverlay, LayoutHardlink} {
		t.Run(string(layout), func(t *testing.T) {
			home := t.TempDir()
			s := openTest(t, home, layout)
			content := func() *bytes.Buffer {
				return tarOf(t, tar.Header{Name: "etc/", Typeflag: tar.TypeDir},
					tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Linkname: "root:x:0:0::/root:/bin/sh\n"})
			}
			if err := s.Create(ctx, "base", ""); err != nil {
				t.Fatal(err)
			}
			if _, err := s.ApplyDiff(ctx, "base", content()); err != nil {
				t.Fatal(err)
			}
			if err := s.Create(ctx, "app", "base"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.ApplyDiff(ctx, "app", content()); err != nil {
				t.Fatal(err)
			}
			// A container layer, written through its mount (here
			// directly into its diff): its empty manifest says no
			// apply put that there.
			if err := s.CreateReadWrite(ctx, "ctr", "base"); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(home, "layers", "ctr", "diff", "mine"), []byte("kept"), 0o644); err != nil {
				t.Fatal(err)
			}
			// The cut: app's record is as it was before its apply.
			if err := s.update(ctx, func(st *state) (bool, error) {
				r := st.Layers["app"]
				r.Applied, r.Size = false, 0
				return true, nil
			}); err != nil {
				t.Fatal(err)
			}
			if rep, err := s.Verify(ctx, "app"); err != nil || rep.State != StateDamaged {
				t.Fatalf("before recovery, app is %s %v (%v); want damaged", rep.State, rep.Damage, err)
			}
			s.Close()

			s2 := openTest(t, home, "")
			for id, want := range map[string]LayerState{"base": StateOK, "app": StateEmpty, "ctr": StateEmpty} {
				if rep, err := s2.Verify(ctx, id); err != nil || rep.State != want {
					t.Errorf("after recovery, %s is %s %v (%v); want %s", id, rep.State, rep.Damage, err, want)
				}
			}
			if ents, err := os.ReadDir(filepath.Join(home, "layers", "app", "diff")); err != nil || len(ents) != 0 {
				t.Errorf("app's diff holds %d entries after recovery (%v)", len(ents), err)
			}
			if b, err := os.ReadFile(filepath.Join(home, "layers", "ctr", "diff", "mine")); err != nil || string(b) != "kept" {
				t.Errorf("the container's file after recovery: %q %v", b, err)
			}
			if ents, _ := os.ReadDir(filepath.Join(home, "staging")); len(ents) != 0 {
				t.Errorf("staging holds %d entries", len(ents))
			}
			if probs, err := s2.Check(); err != nil || len(probs) != 0 {
				t.Errorf("check: %v %v", probs, err)
			}
			// What the caller does when an apply did not return.
			if _, err := s2.ApplyDiff(ctx, "app", content()); err != nil {
				t.Fatalf("apply app again: %v", err)
			}
			if rep, err := s2.Verify(ctx, "app"); err != nil || rep.State != StateOK {
				t.Errorf("app applied again is %s %v (%v)", rep.State, rep.Damage, err)
			}
		})
	}
}
