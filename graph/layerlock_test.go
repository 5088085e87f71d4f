package graph

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The exclusive layer lock keeps its descriptor open between locks (see
// layerFdCache). These tests check that it still excludes what it
// excluded, and that it follows the layer directory when ApplyDiff and
// Remove replace it.

// TestLayerLockExcludesOtherStores: two stores on one home stand for two
// processes; each one's lock, taken and released through its kept
// descriptor, excludes the other's.
func TestLayerLockExcludesOtherStores(t *testing.T) {
	home := t.TempDir()
	s1 := openTest(t, home, LayoutOverlay)
	s2, err := Open(home, Options{Sync: SyncNone, Features: hostFeatures()})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	bg := context.Background()
	must(t, s1.Create(bg, "a", ""))
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(bg, 30*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}
	for round := 0; round < 3; round++ {
		for _, p := range [][2]*Store{{s1, s2}, {s2, s1}} {
			holder, other := p[0], p[1]
			l, err := holder.lockLayer(bg, "a")
			if err != nil {
				t.Fatal(err)
			}
			if l.cached == nil {
				t.Fatal("an exclusive layer lock did not go through the descriptor cache")
			}
			if _, err := other.Get(short(), "a"); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("round %d: Get through the other store while the layer is locked: %v, want context.DeadlineExceeded", round, err)
			}
			l.unlock()
			if _, err := other.Get(bg, "a"); err != nil {
				t.Fatalf("round %d: Get once the lock is released: %v", round, err)
			}
			must(t, holder.Put(bg, "a"))
		}
	}
}

// TestLayerLockFollowsReplacedDirectory: after ApplyDiff exchanged the
// layer directory and after Remove and a new Create of the same ID, the
// lock and the mount record are those of the directory at the path, not
// of the one the kept descriptor was opened on.
func TestLayerLockFollowsReplacedDirectory(t *testing.T) {
	s := openTest(t, t.TempDir(), LayoutOverlay)
	bg := context.Background()
	ino := func(id string) uint64 {
		t.Helper()
		var st unix.Stat_t
		must(t, unix.Stat(s.layerDir(id), &st))
		return st.Ino
	}
	getPut := func(step string) {
		t.Helper()
		if _, err := s.Get(bg, "a"); err != nil {
			t.Fatalf("%s: get: %v", step, err)
		}
		if m, err := s.recordedMounts("a"); err != nil || m.Refs != 1 || !m.Dir {
			t.Fatalf("%s: mount record of the directory at the path: %+v %v", step, m, err)
		}
		if e := s.layerFds.entry("a"); e.ino != ino("a") {
			t.Fatalf("%s: kept descriptor is of inode %d, the layer's is %d", step, e.ino, ino("a"))
		}
		must(t, s.Put(bg, "a"))
	}
	must(t, s.Create(bg, "a", ""))
	getPut("created")
	before := ino("a")
	if _, err := s.ApplyDiff(bg, "a", tarOf(t, reg("f", "x"))); err != nil {
		t.Fatal(err)
	}
	if ino("a") == before {
		t.Fatal("ApplyDiff kept the layer directory; the test needs it replaced")
	}
	getPut("applied")
	must(t, s.Remove(bg, "a"))
	if _, err := s.Get(bg, "a"); !errors.Is(err, ErrNotExist) {
		t.Fatalf("get after remove: %v, want ErrNotExist", err)
	}
	must(t, s.Create(bg, "a", ""))
	getPut("created again")
}

// TestLayerLockCacheBounded: locking many layers keeps a bounded number of
// descriptors open, and Close closes them.
func TestLayerLockCacheBounded(t *testing.T) {
	s, err := Open(t.TempDir(), Options{Create: true, Sync: SyncNone, Features: hostFeatures()})
	if err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	openFds := func() int {
		t.Helper()
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	start := openFds()
	for i := 0; i < 2*layerFdCacheMax+10; i++ {
		id := fmt.Sprintf("l%d", i)
		must(t, s.Create(bg, id, ""))
		if _, err := s.Get(bg, id); err != nil {
			t.Fatal(err)
		}
		must(t, s.Put(bg, id))
	}
	if n := openFds() - start; n > layerFdCacheMax+4 {
		t.Errorf("%d more descriptors open after locking %d layers; the cache keeps at most %d", n, 2*layerFdCacheMax+10, layerFdCacheMax)
	}
	must(t, s.Close())
	if n := openFds() - start; n > 2 {
		t.Errorf("%d more descriptors open after Close than before the store was used", n)
	}
}
