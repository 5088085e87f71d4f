package graph

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func stateWith(n int) *state {
	st := newState(LayoutOverlay, fixedTime)
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("l%d", i)
		st.Layers[id] = &layerRecord{Link: fmt.Sprintf("L%05d", i), Depth: 1, Created: fixedTime.Add(time.Duration(i))}
	}
	return st
}

func mustLoad(t *testing.T, f *stateFile) *state {
	t.Helper()
	st, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Changes append snapshots; the log is compacted before it grows past its
// limit, and two readers (as two processes) each see the other's writes.
func TestStateLogAppendsAndCompacts(t *testing.T) {
	path := filepath.Join(t.TempDir(), stateName)
	a, b := &stateFile{path: path}, &stateFile{path: path}
	if err := a.store(stateWith(1)); err != nil {
		t.Fatal(err)
	}
	compactions, lastIno := 0, a.ino
	for i := 2; i < 400; i++ {
		f := a
		if i%2 == 0 {
			f = b
		}
		if got := len(mustLoad(t, f).Layers); got != i-1 {
			t.Fatalf("step %d: loaded %d layers, want %d", i, got, i-1)
		}
		if err := f.store(stateWith(i)); err != nil {
			t.Fatal(err)
		}
		if f.ino != lastIno {
			compactions++
			lastIno = f.ino
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if limit := max(int64(compactAt), compactSnapshots*fi.Size()); fi.Size() > limit {
			t.Fatalf("step %d: log of %d bytes, past its limit %d", i, fi.Size(), limit)
		}
	}
	if compactions == 0 {
		t.Error("the log was never compacted")
	}
	if got := len(mustLoad(t, a).Layers); got != 399 {
		t.Errorf("final state has %d layers, want 399", got)
	}
}

// A store made before the log format holds one JSON document; it loads,
// and the next change rewrites it as a log.
func TestStateLogReadsSingleJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), stateName)
	doc := `{"version":1,"layout":"hardlink","created":"2026-01-01T00:00:00Z","layers":{"a":{"link":"AAAAAA","depth":1,"created":"2026-01-01T00:00:00Z"}}}` + "\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	f := &stateFile{path: path}
	st := mustLoad(t, f)
	if st.Layout != LayoutHardlink || st.Layers["a"] == nil {
		t.Fatalf("loaded %+v", st)
	}
	st.Layers["b"] = &layerRecord{Link: "BBBBBB", Depth: 1}
	if err := f.store(st); err != nil {
		t.Fatal(err)
	}
	g := &stateFile{path: path}
	if got := mustLoad(t, g); len(got.Layers) != 2 {
		t.Errorf("after the first change: %d layers, want 2", len(got.Layers))
	}
	if g.compact {
		t.Error("the file still needs compaction after a change")
	}
}

// A crash can leave the last snapshot cut short or followed by zeros; the
// previous snapshot is the state then, and the next change compacts the
// damage away instead of appending after it.
func TestStateLogSurvivesDamagedEnd(t *testing.T) {
	for name, damage := range map[string]func(b []byte) []byte{
		"cut":   func(b []byte) []byte { return b[:len(b)-7] },
		"zeros": func(b []byte) []byte { return append(b, make([]byte, 4096)...) },
		"torn":  func(b []byte) []byte { return append(b, []byte(`{"version":1,"lay`)...) },
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), stateName)
			f := &stateFile{path: path}
			for i := 1; i <= 3; i++ {
				if i > 1 {
					mustLoad(t, f)
				}
				if err := f.store(stateWith(i)); err != nil {
					t.Fatal(err)
				}
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, damage(b), 0o600); err != nil {
				t.Fatal(err)
			}
			g := &stateFile{path: path}
			want := 3
			if name == "cut" {
				want = 2
			}
			if got := len(mustLoad(t, g).Layers); got != want {
				t.Fatalf("after damage: %d layers, want %d", got, want)
			}
			if err := g.store(stateWith(5)); err != nil {
				t.Fatal(err)
			}
			if got := len(mustLoad(t, &stateFile{path: path}).Layers); got != 5 {
				t.Errorf("after the next change: %d layers, want 5", got)
			}
		})
	}
}

func TestStateLogRefusesGarbage(t *testing.T) {
	path := filepath.Join(t.TempDir(), stateName)
	if err := os.WriteFile(path, []byte("not a state\x00\x01"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (&stateFile{path: path}).load(); err == nil {
		t.Error("garbage loaded as a state")
	}
}

// peek serves the cached state only while no process changed the file:
// an append or a compaction by another one makes it decline.
func TestStatePeekSeesOtherWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), stateName)
	a, b := &stateFile{path: path}, &stateFile{path: path}
	defer a.close()
	defer b.close()
	if err := a.store(stateWith(1)); err != nil {
		t.Fatal(err)
	}
	if st := a.peek(); st == nil || len(st.Layers) != 1 {
		t.Fatalf("peek after own write: %v", st)
	}
	mustLoad(t, b)
	if err := b.store(stateWith(2)); err != nil { // an append
		t.Fatal(err)
	}
	if a.peek() != nil {
		t.Fatal("peek served a state another writer appended to")
	}
	if got := len(mustLoad(t, a).Layers); got != 2 {
		t.Fatalf("load after the append: %d layers", got)
	}
	if a.peek() == nil {
		t.Fatal("peek declined an unchanged file")
	}
	mustLoad(t, b)
	b.compact = true
	if err := b.store(stateWith(3)); err != nil { // a compaction: a new file
		t.Fatal(err)
	}
	if a.peek() != nil {
		t.Fatal("peek served a state whose file was replaced")
	}
	if got := len(mustLoad(t, a).Layers); got != 3 {
		t.Fatalf("load after the compaction: %d layers", got)
	}
}
