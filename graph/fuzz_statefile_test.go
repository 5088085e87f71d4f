package graph

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// FuzzStateLog feeds arbitrary bytes to the state log reader, as a damaged
// or hostile state file. load must fail or return a state that passes the
// same validation as any state it reads; such a state must survive a
// write and a read unchanged, both added to the file it was read from
// (which may be damaged, or in the single-JSON format) and written to a
// new file. The seed corpus is in testdata/fuzz/FuzzStateLog: logs of one
// and of several snapshots, the single-JSON format, and damaged ends.
func FuzzStateLog(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, stateName)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		sf := &stateFile{path: path}
		defer sf.close()
		st, err := sf.load()
		if err != nil {
			return
		}
		want := encodeForCompare(t, st)
		if _, err := decodeState(want); err != nil {
			t.Fatalf("loaded a state that does not validate: %v\n%s", err, want)
		}
		if err := sf.store(st); err != nil {
			t.Fatalf("store of a loaded state onto its file: %v", err)
		}
		if got := encodeForCompare(t, mustLoad(t, &stateFile{path: path})); !bytes.Equal(got, want) {
			t.Fatalf("state changed by write and read on its file:\n got %s\nwant %s", got, want)
		}
		fresh := &stateFile{path: filepath.Join(dir, "fresh.json")}
		defer fresh.close()
		if err := fresh.store(st); err != nil {
			t.Fatalf("store of a loaded state to a new file: %v", err)
		}
		if got := encodeForCompare(t, mustLoad(t, &stateFile{path: fresh.path})); !bytes.Equal(got, want) {
			t.Fatalf("state changed by write and read on a new file:\n got %s\nwant %s", got, want)
		}
	})
}

// encodeForCompare is the state's canonical form: encoding/json sorts map
// keys, and times compare by their encoding rather than by location
// pointers that differ after every parse.
func encodeForCompare(t *testing.T, st *state) []byte {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatalf("encode a loaded state: %v", err)
	}
	return b
}
