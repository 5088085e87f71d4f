package graph

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/ovlkit/ovlkit/ovl"
	"golang.org/x/sys/unix"
)

// mountRecord is a layer's reference count: how many Get calls, from every
// process, hold its mount, and whether the mount is read-only.
//
// It lives in an xattr of the layer directory rather than in the state
// file. Get and Put then change nothing but that one inode, which mkdir
// and rmdir of the mount point dirty anyway: no rewrite of the state, no
// new file, no data block. The count is only ever changed under the
// layer's lock, whose descriptor is the one the xattr is read and written
// through. It is a hint checked against the kernel before use (Store.live),
// so a count left behind by a crashed process or a reboot does no harm.
type mountRecord struct {
	Refs     int
	ReadOnly bool
	// Dir: the references are to the layer's diff directory itself,
	// which Get hands out without a mount (see Store.direct). Boot is the
	// boot they were taken in: with no mount for the kernel to list, it
	// is what tells a live count from one a reboot left.
	Dir  bool
	Boot string
}

// mountsXattr is the name, after the namespace, of the record's xattr.
const mountsXattr = "ovlkit.mounts"

// volatileXattr records the boot in which the layer was last mounted with
// the overlay "volatile" option.
const volatileXattr = "ovlkit.volatile"

// xattrName is the full name of one of the store's xattrs: trusted.* like
// the overlay's own metadata, user.* for a userxattr store, whose owner
// may not have the privilege to write trusted.*.
func (s *Store) xattrName(name string) string {
	if s.userx {
		return "user." + name
	}
	return "trusted." + name
}

func (s *Store) mountsAttr() string { return s.xattrName(mountsXattr) }

// encode writes "<refs> ro", "<refs> rw" or "<refs> dir <boot>".
func (m mountRecord) encode() []byte {
	v := strconv.Itoa(m.Refs)
	switch {
	case m.Dir:
		v += " dir " + m.Boot
	case m.ReadOnly:
		v += " ro"
	default:
		v += " rw"
	}
	return []byte(v)
}

func decodeMountRecord(b []byte) (mountRecord, error) {
	n, rest, ok := strings.Cut(string(b), " ")
	mode, boot, hasBoot := strings.Cut(rest, " ")
	refs, err := strconv.Atoi(n)
	ok = ok && err == nil && refs >= 0
	switch mode {
	case "ro", "rw":
		ok = ok && !hasBoot
	case "dir":
		ok = ok && boot != "" && !strings.Contains(boot, " ")
	default:
		ok = false
	}
	if !ok {
		return mountRecord{}, fmt.Errorf("malformed mount record %q", b)
	}
	return mountRecord{Refs: refs, ReadOnly: mode == "ro", Dir: mode == "dir", Boot: boot}, nil
}

// layerLock is a held per-layer lock: an open descriptor of the layer
// directory with an exclusive flock on it.
type layerLock struct {
	s  *Store
	id string
	fd int
	// cached: fd belongs to the store's layerFdCache, which keeps it
	// open; unlock releases the flock and the entry instead of closing.
	cached *layerFd
	// excl: the lock is exclusive, and claims the layer's slot of the
	// reference table when it reads the count (see refTable).
	excl bool
	// slot is the layer's slot, if hasSlot; claimed while this lock
	// holds it; gen is the generation the unlock left.
	slot     uint64
	hasSlot  bool
	claimed  bool
	gen      uint64
	freeSlot bool // the layer is gone: unlock gives the slot up
	// read: the mount record xattr was read; record: it is there.
	read, record bool
}

func (l *layerLock) unlock() {
	// The claim ends before the flock: the next holder's claim must
	// not be ended by this one.
	if l.claimed {
		l.gen = l.s.refs.release(l.slot)
		l.claimed = false
		if l.freeSlot {
			l.s.refs.free(l.slot)
		}
	}
	if l.cached == nil {
		unix.Close(l.fd)
		return
	}
	if err := unix.Flock(l.fd, unix.LOCK_UN); err != nil {
		// Not known to be unlocked: closing the descriptor is what
		// surely drops the lock.
		l.cached.closeFd()
	}
	l.cached.release()
}

// layerFdCache keeps the descriptor an exclusive layer lock was taken on
// open after the lock is released, one per layer, so that the next lock
// of the layer in this process is an flock and a stat of the path, not an
// open, an fstat, a stat and a close. A layer's entry is held by one lock
// at a time within the process (its sem): flock does not exclude two
// holders of one open file description, other processes and other
// descriptors it does.
type layerFdCache struct {
	mu sync.Mutex
	m  map[string]*layerFd
}

// layerFdCacheMax bounds the descriptors the cache keeps open; past it,
// taking a lock of one more layer closes those not in use.
const layerFdCacheMax = 128

// layerFd is a cached layer directory descriptor (fd < 0: none open) and
// the device and inode it was opened on.
type layerFd struct {
	sem      chan struct{} // one holder at a time
	fd       int
	dev, ino uint64
}

func (e *layerFd) release() { <-e.sem }

func (e *layerFd) closeFd() {
	if e.fd >= 0 {
		unix.Close(e.fd)
		e.fd = -1
	}
}

// entry returns id's entry, made on first use.
func (c *layerFdCache) entry(id string) *layerFd {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[id]; ok {
		return e
	}
	if c.m == nil {
		c.m = make(map[string]*layerFd)
	}
	if len(c.m) >= layerFdCacheMax {
		c.closeIdleLocked(layerFdCacheMax / 2)
	}
	e := &layerFd{sem: make(chan struct{}, 1), fd: -1}
	c.m[id] = e
	return e
}

// closeIdle closes the descriptors of entries no lock holds until at most
// keep entries are left. An entry dropped while a lock waits for it is
// still that lock's: it opens a descriptor of its own, which flock
// excludes from the next entry's like any other.
func (c *layerFdCache) closeIdle(keep int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeIdleLocked(keep)
}

func (c *layerFdCache) closeIdleLocked(keep int) {
	for id, e := range c.m {
		if len(c.m) <= keep {
			return
		}
		select {
		case e.sem <- struct{}{}:
			e.closeFd()
			delete(c.m, id)
			<-e.sem
		default:
		}
	}
}

// mounts reads the layer's mount record, with the references its slot
// of the reference table counts (claimed, for an exclusive lock); a
// layer never mounted has none.
func (l *layerLock) mounts() (mountRecord, error) {
	m, err := readMountRecord(l.id, func(buf []byte) (int, error) {
		return unix.Fgetxattr(l.fd, l.s.mountsAttr(), buf)
	})
	if err != nil {
		return m, err
	}
	l.read, l.record = true, m != (mountRecord{})
	return l.s.withTableRefs(m, l.tableRefs()), nil
}

// tableRefs is the count of the layer's slot, claimed first by an
// exclusive lock; no slot counts nothing.
func (l *layerLock) tableRefs() uint64 {
	t := l.s.refs
	if t == nil {
		return 0
	}
	if !l.hasSlot {
		if l.slot, l.hasSlot = t.lookup(l.id); !l.hasSlot {
			return 0
		}
	}
	if l.excl && !l.claimed {
		l.claimed = true
		return t.claim(l.slot)
	}
	return t.count(l.slot)
}

// withTableRefs adds n references of the reference table, which are to
// the diff directory in this boot, to record m. A layer with such
// references is not mounted, and a record from another boot is stale.
func (s *Store) withTableRefs(m mountRecord, n uint64) mountRecord {
	if n == 0 {
		return m
	}
	if !m.Dir || m.Boot != s.bootTag {
		m = mountRecord{}
	}
	m.Refs += int(n)
	m.Dir, m.Boot = true, s.bootTag
	return m
}

// readMountRecord decodes the record get reads into buf; no xattr (or no
// layer directory) is no record.
func readMountRecord(id string, get func(buf []byte) (int, error)) (mountRecord, error) {
	var buf [64]byte // "<refs> dir <boot tag>" fits
	n, err := get(buf[:])
	if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOENT) {
		return mountRecord{}, nil
	}
	if err != nil {
		return mountRecord{}, fmt.Errorf("%s: read mount record: %w", id, err)
	}
	m, err := decodeMountRecord(buf[:n])
	if err != nil {
		return mountRecord{}, fmt.Errorf("%s: %w", id, err)
	}
	return m, nil
}

// liveMounts reads the layer's mount record and reports whether it holds
// a mount the kernel still has (see Store.live).
func (l *layerLock) liveMounts() (mountRecord, bool, error) {
	m, err := l.mounts()
	if err != nil {
		return m, false, err
	}
	return m, l.s.live(l.id, m), nil
}

// lockMounts takes id's lock and reads its mount record, as every
// operation on one layer begins; op names the operation in errors. The
// caller unlocks.
func (s *Store) lockMounts(ctx context.Context, op, id string) (*layerLock, mountRecord, bool, error) {
	l, err := s.lockLayer(ctx, id)
	if err != nil {
		return nil, mountRecord{}, false, fmt.Errorf("%s: %w", op, err)
	}
	m, live, err := l.liveMounts()
	if err != nil {
		l.unlock()
		return nil, mountRecord{}, false, fmt.Errorf("%s: %w", op, err)
	}
	return l, m, live, nil
}

// live reports whether record m of id counts a mount that is there: a
// count left by a crashed process or a reboot is not one. References to
// the diff directory are live in the boot that took them; like a mount,
// they outlive a process that exits without Put, until Cleanup.
func (s *Store) live(id string, m mountRecord) bool {
	if m.Refs == 0 {
		return false
	}
	if m.Dir {
		return s.bootTag != "" && m.Boot == s.bootTag
	}
	return isMounted(s.mergedDir(id))
}

// isMounted reports whether the layer's merged directory is an overlay
// mount point right now.
func isMounted(merged string) bool {
	ok, err := ovl.IsOverlay(merged)
	return err == nil && ok
}

// setMounts writes the record; a zero count removes it. References to
// the diff directory are counted in the layer's slot of the reference
// table, which is made on first use, and the xattr goes.
func (l *layerLock) setMounts(m mountRecord) error {
	inTable := m.Dir && m.Refs > 0 && l.ensureSlot()
	if inTable {
		l.s.refs.setCount(l.slot, uint64(m.Refs))
	} else if l.claimed {
		l.s.refs.setCount(l.slot, 0) // counted in the record, if at all
	}
	if inTable || m.Refs == 0 {
		if l.read && !l.record {
			return nil
		}
		err := unix.Fremovexattr(l.fd, l.s.mountsAttr())
		if err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("%s: clear mount record: %w", l.id, err)
		}
		l.record = false
		return nil
	}
	if err := unix.Fsetxattr(l.fd, l.s.mountsAttr(), m.encode(), 0); err != nil {
		return fmt.Errorf("%s: write mount record: %w", l.id, err)
	}
	l.record = true
	return nil
}

// ensureSlot finds or makes the layer's slot and claims it; false: the
// store has no table, or no slot is free near the layer's (its count
// stays in the record).
func (l *layerLock) ensureSlot() bool {
	t := l.s.refs
	if t == nil || !l.excl {
		return false
	}
	if !l.hasSlot {
		if l.slot, l.hasSlot = t.lookup(l.id); !l.hasSlot {
			if l.slot, l.hasSlot = t.alloc(l.id); !l.hasSlot {
				return false
			}
		}
	}
	if !l.claimed {
		l.claimed = true
		t.claim(l.slot)
	}
	return true
}

// mountsOf reads id's mount record without its lock, for reports; a
// record that says mounted is believed only when the kernel agrees.
func (s *Store) mountsOf(id string) (mountRecord, error) {
	m, err := s.recordedMounts(id)
	if err != nil || m.Refs == 0 || s.live(id, m) {
		return m, err
	}
	return mountRecord{}, nil
}

// recordedMounts is id's mount record as written, with the references
// of its slot in the reference table.
func (s *Store) recordedMounts(id string) (mountRecord, error) {
	m, err := readMountRecord(id, func(buf []byte) (int, error) {
		return unix.Lgetxattr(s.layerDir(id), s.mountsAttr(), buf)
	})
	if err != nil || s.refs == nil {
		return m, err
	}
	if i, ok := s.refs.lookup(id); ok {
		m = s.withTableRefs(m, s.refs.count(i))
	}
	return m, nil
}

// prepareVolatile readies a container layer for a volatile mount.
// overlayfs marks its work directory on such a mount and refuses the next
// mount while the mark is there, since the upper may never have reached
// the disk. Within the boot of the last volatile mount the page cache
// still holds everything, so the mark is cleared; after a reboot the layer
// may be torn and is refused. The boot is recorded before the mount.
func (s *Store) prepareVolatile(l *layerLock) error {
	mark := filepath.Join(s.workDir(l.id), "work", "incompat", "volatile")
	name := s.xattrName(volatileXattr)
	if _, err := os.Lstat(mark); err == nil {
		var buf [128]byte
		n, err := unix.Fgetxattr(l.fd, name, buf[:])
		if err != nil || string(buf[:n]) != s.boot {
			return fmt.Errorf("%s: %w", l.id, ErrVolatileLost)
		}
		if err := os.RemoveAll(mark); err != nil {
			return fmt.Errorf("%s: clear volatile mark: %w", l.id, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w", l.id, err)
	}
	if err := unix.Fsetxattr(l.fd, name, []byte(s.boot), 0); err != nil {
		return fmt.Errorf("%s: record volatile mount: %w", l.id, err)
	}
	return nil
}

// lockLayer takes the per-layer lock of id: an exclusive flock on the
// layer directory, which conflicts with every other holder in this or
// another process. ApplyDiff replaces the directory by an exchange, so the
// lock is retried until it is held on the directory currently in place.
// Waiting for it ends when ctx is done.
func (s *Store) lockLayer(ctx context.Context, id string) (*layerLock, error) {
	return s.lockLayerHow(ctx, id, unix.LOCK_EX)
}

func (s *Store) lockLayerHow(ctx context.Context, id string, how int) (*layerLock, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	if how == unix.LOCK_EX {
		return s.lockLayerCached(ctx, id)
	}
	dir := s.layerDir(id)
	for {
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil, fmt.Errorf("%s: %w", id, ErrNotExist)
			}
			return nil, fmt.Errorf("lock layer %s: %w", id, err)
		}
		if err := flockCtx(ctx, fd, how); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("lock layer %s: %w", id, err)
		}
		var held, cur unix.Stat_t
		if err := unix.Fstat(fd, &held); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("lock layer %s: %w", id, err)
		}
		err = unix.Stat(dir, &cur)
		if err == nil && held.Ino == cur.Ino && held.Dev == cur.Dev {
			return &layerLock{s: s, id: id, fd: fd, excl: how&unix.LOCK_EX != 0}, nil
		}
		unix.Close(fd)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("lock layer %s: %w", id, err)
		}
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("%s: %w", id, ErrNotExist)
		}
	}
}

// lockLayerCached is lockLayer through the store's cache of layer
// directory descriptors: the cached descriptor, or a new one, is locked,
// and the lock holds if the path still names the directory it was opened
// on (ApplyDiff exchanges the directory, Remove renames it away).
func (s *Store) lockLayerCached(ctx context.Context, id string) (*layerLock, error) {
	e := s.layerFds.entry(id)
	select {
	case e.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("lock layer %s: %w", id, ctx.Err())
	}
	l, err := s.lockLayerFd(ctx, id, e)
	if err != nil {
		e.release()
		return nil, err
	}
	return l, nil
}

// lockLayerFd locks id through entry e, which the caller holds.
func (s *Store) lockLayerFd(ctx context.Context, id string, e *layerFd) (*layerLock, error) {
	dir := s.layerDir(id)
	for {
		if e.fd < 0 {
			fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				if errors.Is(err, unix.ENOENT) {
					return nil, fmt.Errorf("%s: %w", id, ErrNotExist)
				}
				return nil, fmt.Errorf("lock layer %s: %w", id, err)
			}
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				unix.Close(fd)
				return nil, fmt.Errorf("lock layer %s: %w", id, err)
			}
			e.fd, e.dev, e.ino = fd, st.Dev, st.Ino
		}
		if err := flockCtx(ctx, e.fd, unix.LOCK_EX); err != nil {
			return nil, fmt.Errorf("lock layer %s: %w", id, err)
		}
		var cur unix.Stat_t
		err := unix.Stat(dir, &cur)
		if err == nil && cur.Ino == e.ino && cur.Dev == e.dev {
			return &layerLock{s: s, id: id, fd: e.fd, cached: e, excl: true}, nil
		}
		// The descriptor is of a directory no longer at the path.
		e.closeFd()
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("%s: %w", id, ErrNotExist)
		}
		if err != nil {
			return nil, fmt.Errorf("lock layer %s: %w", id, err)
		}
	}
}
