package layer

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzApply feeds arbitrary streams to Apply. Whatever the input, Apply
// must not panic or hang, nothing outside the root may change, and a layer
// it accepts must have the size Apply returned and export and apply again
// to the same tree, root included: apply(export(apply(t))) == apply(t).
func FuzzApply(f *testing.F) {
	f.Add(richLayer(f))
	f.Add(gzipped(f, richLayer(f)))
	f.Add(zstded(f, richLayer(f)))
	f.Add(mkTar(f, dir("d1/", 0o700), reg("d1/.wh..wh..opq", "", 0o700), reg("d1/f1", "x", 0o600), reg(".wh.gone", "", 0o600)))
	for _, tc := range breakoutCases() {
		f.Add(mkTar(f, tc.entries...))
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		root := filepath.Join(base, "root")
		victim := filepath.Join(base, "victim")
		mkdirs(t, root)
		writeFile(t, filepath.Join(victim, "hello"), "hello", 0o644)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n, err := Apply(ctx, root, bytes.NewReader(data), ApplyOptions{MaxSize: 16 << 20})
		if got, rerr := os.ReadFile(filepath.Join(victim, "hello")); rerr != nil || string(got) != "hello" {
			t.Fatalf("victim changed: %q %v", got, rerr)
		}
		if entries, _ := os.ReadDir(base); len(entries) != 2 {
			t.Fatalf("apply created entries next to the root")
		}
		if entries, _ := os.ReadDir(victim); len(entries) != 1 {
			t.Fatalf("apply created entries in the victim directory")
		}
		if err != nil || ctx.Err() != nil {
			return
		}
		// The size the store records must be what its check reads back.
		if size, err := Size(root); err != nil || size != n {
			t.Fatalf("Apply returned %d content bytes, Size reads %d (%v)", n, size, err)
		}
		var buf bytes.Buffer
		if err := Export(ctx, &buf, root, ExportOptions{}); err != nil {
			t.Fatalf("export of an accepted layer: %v", err)
		}
		// The second apply starts from a root like the first one's.
		again := filepath.Join(base, "again")
		mkdirs(t, again)
		if _, err := Apply(ctx, again, &buf, ApplyOptions{}); err != nil {
			t.Fatalf("apply of the exported layer: %v", err)
		}
		equalLists(t, "tree after export and apply", fullTree(t, again), fullTree(t, root))
	})
}
