package graph

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// refTable counts the references Get hands out to diff directories (see
// direct) in memory every process of the store maps: the file refs in the
// store's home, shared and writable. It is what lets Get and Put of such
// a layer, once this process has seen it, take and drop a reference with
// one atomic operation and no system call, where the layer lock and the
// mount record cost eight (moby's overlay2 makes two and counts nothing).
//
// Each layer that has been handed out this boot has a slot: the owner (a
// hash of its ID) and one 64-bit word, a generation in the high half and
// the count in the low half. An exclusive holder of the layer's lock
// claims the slot as soon as it reads the count (the generation turns
// odd) and releases it when it unlocks (even again, one higher), so
// whatever it does under the lock, remove the layer, hold it, apply to
// it, make it a parent, is seen by every process that planned a Get
// before: their compare-and-swap expects the generation they saw and
// fails. Count and generation change in the same word, so a reference is
// either taken before the claim, and the claim holder sees it, or not at
// all.
//
// The table is boot-scoped like the references it counts: it keeps the
// boot it was made in, and the first Open of a later boot empties it. A
// process that exits without Put leaves its references counted, as the
// mount record does.
type refTable struct {
	// mu keeps close from unmapping the table under a reader; every
	// use holds it shared, which costs an atomic operation, not a
	// system call.
	mu    sync.RWMutex
	mem   []byte // nil once closed
	slots uint64
}

const (
	refsName       = "refs"
	refsMagic      = "ovlkit-refs 1\n"
	refsHeaderSize = 4096
	refsSlotSize   = 16
	refsSlots      = 1 << 16
	// refsMaxProbe bounds the slots one layer's lookup visits; a layer
	// that finds no free slot within it keeps its count in the mount
	// record, as before the table.
	refsMaxProbe = 64

	ownerFree      = 0
	ownerTombstone = 1

	refCountMask = 1<<32 - 1
)

// openRefTable maps the store's reference table, made or emptied for
// boot (a bootTag) under the file's own lock. A table of another format
// in the same boot is some other version's, which may be using it: it is
// refused, and Open fails (see Store.openRefs).
func openRefTable(home, boot string) (*refTable, error) {
	path := filepath.Join(home, refsName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, ownerOnly&0o600)
	if err != nil {
		return nil, fmt.Errorf("reference table: %w", err)
	}
	defer f.Close()
	fd := int(f.Fd())
	if err := flock(fd, unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("reference table: lock: %w", err)
	}
	// The mapping keeps the open file, and the flock on it, after the
	// close: the next Open would wait forever. A failed unlock is the
	// same hang, so it is the one reported.
	unlocked := false
	defer func() {
		if !unlocked {
			_ = flock(fd, unix.LOCK_UN)
		}
	}()
	size := int64(refsHeaderSize + refsSlots*refsSlotSize)
	header := make([]byte, refsHeaderSize)
	n, err := f.ReadAt(header, 0)
	if err != nil && n < len(header) && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("reference table: %w", err)
	}
	magic, tableBoot, slots := decodeRefsHeader(header[:n])
	switch {
	case magic && tableBoot == boot && slots == refsSlots:
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return nil, fmt.Errorf("reference table: %w", err)
		}
		if st.Size != size {
			return nil, fmt.Errorf("reference table %s: size %d, want %d", path, st.Size, size)
		}
	case magic && tableBoot == boot:
		return nil, fmt.Errorf("reference table %s: %d slots, this version uses %d", path, slots, refsSlots)
	default:
		// Made in an earlier boot, or never: nobody in this boot maps
		// it yet, since every Open comes here first.
		if err := f.Truncate(0); err != nil {
			return nil, fmt.Errorf("reference table: %w", err)
		}
		if err := f.Truncate(size); err != nil {
			return nil, fmt.Errorf("reference table: %w", err)
		}
		if _, err := f.WriteAt(encodeRefsHeader(boot, refsSlots), 0); err != nil {
			return nil, fmt.Errorf("reference table: %w", err)
		}
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("reference table: map: %w", err)
	}
	unlocked = true
	if err := flock(fd, unix.LOCK_UN); err != nil {
		_ = unix.Munmap(mem)
		return nil, fmt.Errorf("reference table: unlock: %w", err)
	}
	return &refTable{mem: mem, slots: refsSlots}, nil
}

func encodeRefsHeader(boot string, slots uint64) []byte {
	b := make([]byte, 0, refsHeaderSize)
	b = append(b, refsMagic...)
	b = binary.LittleEndian.AppendUint64(b, slots)
	b = append(b, byte(len(boot)))
	return append(b, boot...)
}

// decodeRefsHeader reads what encodeRefsHeader wrote; magic is false for
// anything else.
func decodeRefsHeader(b []byte) (magic bool, boot string, slots uint64) {
	if len(b) < len(refsMagic)+9 || string(b[:len(refsMagic)]) != refsMagic {
		return false, "", 0
	}
	b = b[len(refsMagic):]
	slots = binary.LittleEndian.Uint64(b)
	n := int(b[8])
	if len(b) < 9+n {
		return false, "", 0
	}
	return true, string(b[9 : 9+n]), slots
}

func (t *refTable) close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mem == nil {
		return nil
	}
	err := unix.Munmap(t.mem)
	t.mem = nil
	return err
}

// hold keeps the table mapped until the matching t.mu.RUnlock; false: it
// is closed, and nothing is held.
func (t *refTable) hold() bool {
	t.mu.RLock()
	if t.mem == nil {
		t.mu.RUnlock()
		return false
	}
	return true
}

// owner and word are slot i's two fields. The mapping is page-aligned
// and every field 8-byte aligned, as 64-bit atomics need.
func (t *refTable) owner(i uint64) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&t.mem[refsHeaderSize+i*refsSlotSize]))
}

func (t *refTable) word(i uint64) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&t.mem[refsHeaderSize+i*refsSlotSize+8]))
}

// refOwner is the owner value of layer id: never free or a tombstone.
func refOwner(id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	if v := h.Sum64(); v > ownerTombstone {
		return v
	}
	return ownerTombstone + 1
}

// lookup returns id's slot. Slots are placed by linear probing from the
// owner's home slot; a free slot ends the search, a tombstone does not.
func (t *refTable) lookup(id string) (uint64, bool) {
	if !t.hold() {
		return 0, false
	}
	defer t.mu.RUnlock()
	o := refOwner(id)
	for k := uint64(0); k < refsMaxProbe; k++ {
		i := (o + k) % t.slots
		switch t.owner(i).Load() {
		case o:
			return i, true
		case ownerFree:
			return 0, false
		}
	}
	return 0, false
}

// alloc gives id a slot; the caller holds id's lock and found none. The
// first free slot or tombstone from the home slot on is taken; losing it
// to another layer starts the search again, so that no free slot is left
// between a layer's home and its slot.
func (t *refTable) alloc(id string) (uint64, bool) {
	if !t.hold() {
		return 0, false
	}
	defer t.mu.RUnlock()
	o := refOwner(id)
retry:
	for k := uint64(0); k < refsMaxProbe; k++ {
		i := (o + k) % t.slots
		cur := t.owner(i).Load()
		if cur != ownerFree && cur != ownerTombstone {
			continue
		}
		if !t.owner(i).CompareAndSwap(cur, o) {
			goto retry
		}
		return i, true
	}
	return 0, false
}

// free gives slot i up; its holder has released its claim and the count
// is zero. The slot stays a tombstone, which alloc takes again, for the
// rest of the boot: turning it back to free could cut off the search for
// a layer that another process is placing behind it at the same time.
func (t *refTable) free(i uint64) {
	if !t.hold() {
		return
	}
	defer t.mu.RUnlock()
	t.owner(i).Store(ownerTombstone)
}

func refGen(w uint64) uint64   { return w >> 32 }
func refCount(w uint64) uint64 { return w & refCountMask }

// claim makes slot i's generation odd for an exclusive lock holder and
// returns the count it froze. A generation already odd is a holder that
// died with the lock: its claim passes to this one.
func (t *refTable) claim(i uint64) uint64 {
	if !t.hold() {
		return 0
	}
	defer t.mu.RUnlock()
	for {
		w := t.word(i).Load()
		if refGen(w)%2 == 1 {
			return refCount(w)
		}
		if t.word(i).CompareAndSwap(w, w+1<<32) {
			return refCount(w)
		}
	}
}

// setCount sets a claimed slot's count.
func (t *refTable) setCount(i, n uint64) {
	if !t.hold() {
		return
	}
	defer t.mu.RUnlock()
	for {
		w := t.word(i).Load()
		if t.word(i).CompareAndSwap(w, w&^refCountMask|n&refCountMask) {
			return
		}
	}
}

// release ends a claim and returns the even generation it leaves.
func (t *refTable) release(i uint64) uint64 {
	if !t.hold() {
		return 0
	}
	defer t.mu.RUnlock()
	for {
		w := t.word(i).Load()
		nw := w + 1<<32
		if refGen(w)%2 == 0 {
			return refGen(w) // not claimed
		}
		if t.word(i).CompareAndSwap(w, nw) {
			return refGen(nw)
		}
	}
}

// count is slot i's count as it is now.
func (t *refTable) count(i uint64) uint64 {
	if !t.hold() {
		return 0
	}
	defer t.mu.RUnlock()
	return refCount(t.word(i).Load())
}

// add changes slot i's count by one, up or down (delta > 0 or < 0), if its generation is
// still gen: nobody has held the layer's lock since this process planned
// with gen. A count would never go below zero or past the field.
func (t *refTable) add(i, gen uint64, delta int) bool {
	if !t.hold() {
		return false
	}
	defer t.mu.RUnlock()
	for {
		w := t.word(i).Load()
		c := refCount(w)
		if refGen(w) != gen || gen%2 == 1 || (delta < 0 && c == 0) || (delta > 0 && c == refCountMask) {
			return false
		}
		nw := w + 1
		if delta < 0 {
			nw = w - 1
		}
		if t.word(i).CompareAndSwap(w, nw) {
			return true
		}
	}
}
