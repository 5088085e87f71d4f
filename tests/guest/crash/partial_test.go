//go:build ovlkit_guest

package crash

import (
	"crypto/sha256"
	"testing"
)

func fileState(data string, mode uint32) state {
	return state{exists: true, size: int64(len(data)), sum: sha256.Sum256([]byte(data)), mode: mode, uid: lowerUID, gid: lowerGID, data: data}
}

// TestPartialAppend: what an unsynced append may leave passes, damage to
// the content before it does not.
func TestPartialAppend(t *testing.T) {
	old, cur := "lower content", "lower content+appended"
	states := []state{fileState(old, 0o644), fileState(cur, 0o644)}
	for _, c := range []struct {
		got  state
		want bool
	}{
		{fileState(old+"+app", 0o644), true},                                 // the first bytes only
		{fileState(old+"\x00\x00\x00\x00\x00\x00\x00\x00\x00", 0o644), true}, // size first, data not
		{fileState(old+"+\x00ppended", 0o644), true},
		{fileState("lower", 0o644), false},                                 // truncated below the old size
		{fileState("\x00\x00\x00\x00\x00 content+appended", 0o644), false}, // the copied-up part zeroed
		{fileState(old+"+appendeX", 0o644), false},                         // a byte that was never written
		{fileState(old+"+app", 0o600), false},                              // attributes of neither state
		{fileState(cur+"more", 0o644), false},                              // longer than the append
		{state{exists: true, dir: true}, false},
	} {
		if got := partialAppend(states, 1, c.got); got != c.want {
			t.Errorf("partialAppend(%q, mode %o) = %v, want %v", c.got.data, c.got.mode, got, c.want)
		}
	}
}
