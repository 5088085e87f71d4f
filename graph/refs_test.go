package graph

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// newMemRefTable is a table of n slots in ordinary memory, for tests of
// the slot logic without a file.
func newMemRefTable(n uint64) *refTable {
	words := make([]uint64, (refsHeaderSize+n*refsSlotSize)/8) // 8-byte aligned
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
	return &refTable{mem: mem, slots: n}
}

func TestRefTableSlots(t *testing.T) {
	tb := newMemRefTable(4) // every ID shares four slots: probing is taken
	ids := []string{"a", "b", "c", "d"}
	slots := map[uint64]string{}
	for _, id := range ids {
		if _, ok := tb.lookup(id); ok {
			t.Fatalf("%s found before alloc", id)
		}
		i, ok := tb.alloc(id)
		if !ok {
			t.Fatalf("alloc %s in a table with room", id)
		}
		if other, dup := slots[i]; dup {
			t.Fatalf("%s and %s share slot %d", id, other, i)
		}
		slots[i] = id
	}
	if _, ok := tb.alloc("e"); ok {
		t.Fatal("alloc in a full table")
	}
	for i, id := range slots {
		if j, ok := tb.lookup(id); !ok || j != i {
			t.Fatalf("lookup %s: %d %v, want %d", id, j, ok, i)
		}
	}
	// A freed slot is a tombstone: the others are still found past it,
	// and the next alloc takes it.
	var freed uint64
	for i, id := range slots {
		if id == "b" {
			freed = i
		}
	}
	tb.free(freed)
	if _, ok := tb.lookup("b"); ok {
		t.Fatal("freed b still found")
	}
	for _, id := range []string{"a", "c", "d"} {
		if _, ok := tb.lookup(id); !ok {
			t.Fatalf("%s lost after b was freed", id)
		}
	}
	if i, ok := tb.alloc("e"); !ok || i != freed {
		t.Fatalf("alloc after free: %d %v, want the tombstone %d", i, ok, freed)
	}
}

// The count changes through add only while the generation is the one
// planned with; a claim freezes it, and its release moves it on.
func TestRefTableClaims(t *testing.T) {
	tb := newMemRefTable(8)
	i, _ := tb.alloc("x")
	if n := tb.claim(i); n != 0 {
		t.Fatalf("claim of a new slot counted %d", n)
	}
	tb.setCount(i, 2)
	if tb.add(i, 0, 1) || tb.add(i, 1, 1) {
		t.Fatal("add while claimed")
	}
	gen := tb.release(i)
	if gen != 2 || tb.count(i) != 2 {
		t.Fatalf("release: generation %d count %d, want 2 and 2", gen, tb.count(i))
	}
	if tb.add(i, 0, 1) {
		t.Fatal("add with the generation before the claim")
	}
	for _, d := range []int{-1, -1} {
		if !tb.add(i, gen, d) {
			t.Fatal("put with the current generation")
		}
	}
	if tb.add(i, gen, -1) {
		t.Fatal("count went below zero")
	}
	if !tb.add(i, gen, 1) || tb.claim(i) != 1 {
		t.Fatal("claim does not see the reference add took")
	}
	// A claim left by a holder that died passes to the next holder.
	if tb.claim(i) != 1 || tb.release(i) != gen+2 {
		t.Fatal("second claim")
	}
}

// The table outlives the processes of a boot and not the boot.
func TestRefTableBoot(t *testing.T) {
	home := t.TempDir()
	t1, err := openRefTable(home, "boot-1")
	must(t, err)
	i, _ := t1.alloc("x")
	t1.claim(i)
	t1.setCount(i, 3)
	t1.release(i)
	t2, err := openRefTable(home, "boot-1")
	must(t, err)
	if j, ok := t2.lookup("x"); !ok || j != i || t2.count(j) != 3 {
		t.Fatalf("same boot: slot %d %v count %d, want slot %d count 3", j, ok, t2.count(j), i)
	}
	// Both map the same pages.
	if !t2.add(i, 2, 1) || t1.count(i) != 4 {
		t.Fatalf("a reference through one mapping: %d through the other, want 4", t1.count(i))
	}
	must(t, t1.close())
	must(t, t2.close())
	t3, err := openRefTable(home, "boot-2")
	must(t, err)
	if _, ok := t3.lookup("x"); ok {
		t.Fatal("a later boot kept the slot")
	}
	if t3.count(i) != 0 {
		t.Fatal("a later boot kept the count")
	}
	must(t, t3.close())
	if _, ok := t3.lookup("x"); ok || t3.add(i, 0, 1) {
		t.Fatal("closed table used")
	}
	fi, err := os.Stat(filepath.Join(home, refsName))
	must(t, err)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("table mode %v, want 0600", fi.Mode().Perm())
	}
}

// A table of another format in the same boot belongs to another version,
// which may be using it: Open refuses it rather than count apart.
func TestRefTableOtherFormatRefused(t *testing.T) {
	home := t.TempDir()
	must(t, os.WriteFile(filepath.Join(home, refsName), encodeRefsHeader("boot-1", 7), 0o600))
	if _, err := openRefTable(home, "boot-1"); err == nil {
		t.Fatal("a table of 7 slots was used")
	}
	if tb, err := openRefTable(home, "boot-2"); err != nil {
		t.Fatalf("a later boot's first open: %v", err)
	} else {
		must(t, tb.close())
	}
}

// A Get planned before is one operation on the table, and every other
// process sees its reference as it sees one taken under the lock.
func TestPlannedGetSharedBetweenOpens(t *testing.T) {
	ctx := context.Background()
	home := t.TempDir()
	s1 := openTest(t, home, LayoutOverlay)
	s2 := openTest(t, home, LayoutOverlay)
	must(t, s1.CreateReadWrite(ctx, "ctr", ""))
	p, err := s1.Get(ctx, "ctr") // plans
	must(t, err)
	must(t, s1.Put(ctx, "ctr"))
	if _, ok := s1.planned.get("ctr"); !ok {
		t.Fatal("no plan after Get")
	}
	// The planned Get takes no lock: it returns while another process
	// holds the layer's lock (one that has not claimed the slot).
	l, err := s2.lockLayer(ctx, "ctr")
	must(t, err)
	short, cancel := context.WithTimeout(ctx, time.Second)
	p2, err := s1.Get(short, "ctr")
	cancel()
	l.unlock()
	if err != nil || p2 != p {
		t.Fatalf("planned get: %s %v, want %s", p2, err, p)
	}
	if li, err := s2.Layer("ctr"); err != nil || li.Mounts != 1 || li.Path != p {
		t.Errorf("other open sees %+v %v, want one reference", li, err)
	}
	if err := s2.Remove(ctx, "ctr"); !errors.Is(err, ErrMounted) {
		t.Errorf("remove of a layer referenced by a planned get: %v, want ErrMounted", err)
	}
	// Another process's Put drops it, and this one's then finds none.
	must(t, s2.Put(ctx, "ctr"))
	if err := s1.Put(ctx, "ctr"); !errors.Is(err, ErrNotMounted) {
		t.Errorf("second put of one reference: %v, want ErrNotMounted", err)
	}
	must(t, s2.Remove(ctx, "ctr"))
	if _, err := s1.Get(ctx, "ctr"); !errors.Is(err, ErrNotExist) {
		t.Errorf("planned get after another process removed the layer: %v, want ErrNotExist", err)
	}
	// A new layer of the same ID plans afresh.
	must(t, s2.CreateReadWrite(ctx, "ctr", ""))
	if _, err := s1.Get(ctx, "ctr"); err != nil {
		t.Fatal(err)
	}
	if err := s2.Remove(ctx, "ctr"); !errors.Is(err, ErrMounted) {
		t.Errorf("remove of the new layer while referenced: %v", err)
	}
	must(t, s1.Put(ctx, "ctr"))
	must(t, s2.Remove(ctx, "ctr"))
}

// A hold taken by another process changes what Get may hand out: the
// planned Get must see that, and plan again.
func TestPlannedGetSeesHold(t *testing.T) {
	ctx := context.Background()
	home := t.TempDir()
	s1 := openTest(t, home, LayoutOverlay)
	s2 := openTest(t, home, LayoutOverlay)
	must(t, s1.CreateReadWrite(ctx, "ctr", ""))
	_, err := s1.Get(ctx, "ctr")
	must(t, err)
	must(t, s1.Put(ctx, "ctr"))
	if _, err := s2.Acquire(ctx, "ctr", "runtime"); err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Get(ctx, "ctr"); !errors.Is(err, ErrMounted) {
		t.Errorf("get of a held layer: %v, want ErrMounted as without a plan", err)
	}
}

// Gets and Puts from two opens race with a Remove: Remove succeeds only
// when no reference is held, and after it no Get hands out a path.
func TestPlannedGetRacesRemove(t *testing.T) {
	ctx := context.Background()
	home := t.TempDir()
	stores := []*Store{openTest(t, home, LayoutOverlay), openTest(t, home, LayoutOverlay)}
	for round := 0; round < 20; round++ {
		id := fmt.Sprintf("ctr-%d", round)
		must(t, stores[0].CreateReadWrite(ctx, id, ""))
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func(s *Store, w int) {
				defer wg.Done()
				for k := 0; ; k++ {
					p, err := s.Get(ctx, id)
					if errors.Is(err, ErrNotExist) {
						return // removed, which the loop below waits for
					}
					if err != nil {
						errs <- fmt.Errorf("get %s: %w", id, err)
						return
					}
					f := filepath.Join(p, fmt.Sprintf("w%d", w))
					if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
						errs <- fmt.Errorf("write through a held reference: %w", err)
						return
					}
					if err := os.Remove(f); err != nil {
						errs <- fmt.Errorf("the layer went while referenced: %w", err)
						return
					}
					if err := s.Put(ctx, id); err != nil {
						errs <- fmt.Errorf("put %s: %w", id, err)
						return
					}
				}
			}(stores[w%2], w)
		}
		for {
			err := stores[round%2].Remove(ctx, id)
			if err == nil {
				break
			}
			if !errors.Is(err, ErrMounted) {
				t.Fatalf("remove: %v", err)
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}

// refsHelperEnv makes the test binary a process that takes and drops
// references to one layer until it is removed (see refsHelper).
const refsHelperEnv = "OVLKIT_GRAPH_REFS_HELPER_HOME"

// refsHelper gets, writes through and puts layer id of the store in home
// until the layer is gone, and prints how many rounds it made.
func refsHelper(home, id string) int {
	s, err := Open(home, Options{Sync: SyncNone, Features: hostFeatures()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Close()
	for n := 0; ; n++ {
		err := holdOnce(s, id, fmt.Sprintf("helper-%d", os.Getpid()))
		if errors.Is(err, ErrNotExist) {
			fmt.Println(n)
			return 0
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
}

// holdOnce takes a reference to id, writes and removes a file through
// it, and drops it: the layer must stay while the reference is held.
func holdOnce(s *Store, id, who string) error {
	ctx := context.Background()
	p, err := s.Get(ctx, id)
	if err != nil {
		return err
	}
	f := filepath.Join(p, who)
	if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
		return fmt.Errorf("write through a held reference: %w", err)
	}
	if err := os.Remove(f); err != nil {
		return fmt.Errorf("the layer went while referenced: %w", err)
	}
	return s.Put(ctx, id)
}

// Two other processes take and drop references while this one removes
// the layer: the table is shared through the file, and Remove waits for
// a moment without references.
func TestPlannedGetAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	home := t.TempDir()
	s := openTest(t, home, LayoutOverlay)
	must(t, s.CreateReadWrite(ctx, "ctr", ""))
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for i := 0; i < 2; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.Env = append(os.Environ(), refsHelperEnv+"="+home, "OVLKIT_GRAPH_HELPER_PREFIX=ctr")
		must(t, cmd.Start())
		cmds, outs = append(cmds, cmd), append(outs, &out)
	}
	// Let the helpers plan and loop before the removal begins.
	deadline := time.Now().Add(10 * time.Second)
	for seen := 0; seen < 20 && time.Now().Before(deadline); {
		if li, err := s.Layer("ctr"); err == nil && li.Mounts > 0 {
			seen++
		}
		time.Sleep(5 * time.Millisecond)
	}
	deadline = time.Now().Add(time.Minute)
	for {
		err := s.Remove(ctx, "ctr")
		if err == nil {
			break
		}
		if !errors.Is(err, ErrMounted) || time.Now().After(deadline) {
			for i, cmd := range cmds {
				logCleanup(s.log, "kill helper", cmd.Process.Kill())
				_ = cmd.Wait()
				t.Logf("helper %d: %s", i, outs[i])
			}
			t.Fatalf("remove: %v", err)
		}
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper %d: %v: %s", i, err, outs[i])
		}
		var rounds int
		if _, err := fmt.Sscan(outs[i].String(), &rounds); err != nil || rounds < 2 {
			t.Errorf("helper %d made %q rounds, want at least 2 (one planned)", i, outs[i])
		}
	}
}
