package graph

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// direct reports whether Get hands out layer r's diff directory itself
// instead of mounting it, as moby's overlay2 does for a layer without a
// parent. The mount would put the diff as upper over an empty lower:
// it shows the diff as it is and writes straight into it, with nothing
// below to copy up, white out or redirect to; and the mount and unmount
// cost several times the rest of Get and Put (ro says the mount would be
// read-only). It is not done for
//
//   - read-only views (a committed layer, an image layer's tree in the
//     hardlink layout): the mount keeps writers out of what children
//     stack on, and is nosuid,nodev;
//   - stores with userxattr: through a mount, overlayfs refuses to set
//     its own user.overlay.* xattrs, which any writer could set directly
//     and which take effect once the layer is a lower (trusted.* needs
//     the privilege to mount anyway);
//   - a store that could not read the boot ID, which tells a live
//     reference to a directory from one a reboot left.
func (s *Store) direct(r *layerRecord, ro bool) bool {
	return r.Parent == "" && !ro && !s.userx && s.bootTag != ""
}

// bootTag is the form of boot ID a mount record keeps: the fallback ID
// (see bootID) has spaces and may be long, the record's field may not.
func bootTag(boot string) string {
	sum := sha256.Sum256([]byte(boot))
	return hex.EncodeToString(sum[:16])
}

// rootPath is where id, referenced as m says, shows its content.
func (s *Store) rootPath(id string, m mountRecord) string {
	if m.Dir {
		return s.diffDir(id)
	}
	return s.mergedDir(id)
}

// getDirect takes the first reference to the diff directory of id (see
// direct), whose lock l the caller holds; written says Get must record
// that the applied layer is written from now on.
func (s *Store) getDirect(ctx context.Context, l *layerLock, id string, written bool) (string, error) {
	if err := s.checkVolatileMark(l); err != nil {
		return "", fmt.Errorf("get: %w", err)
	}
	if written {
		// Before the path is handed out, as for a mount (see Get).
		err := s.update(context.WithoutCancel(ctx), func(st *state) (bool, error) {
			st.Layers[id].Written = true
			return true, nil
		})
		if err != nil {
			return "", fmt.Errorf("get %s: %w", id, err)
		}
	}
	if err := l.setMounts(mountRecord{Refs: 1, Dir: true, Boot: s.bootTag}); err != nil {
		return "", fmt.Errorf("get: %w", err)
	}
	return s.diffDir(id), nil
}

// volatileMarkPath is overlayfs's volatile mark in a layer's work
// directory, relative to the layer directory.
const volatileMarkPath = "work/work/incompat/volatile"

// checkVolatileMark refuses, as the kernel refuses the mount, a layer
// that a volatile mount of an earlier version of the store may have left
// torn: overlayfs's mark in the work directory, from a boot before this
// one. A mark from this boot is dropped once syncfs has made what that
// mount wrote durable, since no mount of the layer follows to own it.
func (s *Store) checkVolatileMark(l *layerLock) error {
	// Looked up from the locked layer directory: the same file, a
	// shorter walk.
	mark := filepath.Join(s.workDir(l.id), "work", "incompat", "volatile")
	var st unix.Stat_t
	if err := unix.Fstatat(l.fd, volatileMarkPath, &st, unix.AT_SYMLINK_NOFOLLOW); errors.Is(err, unix.ENOENT) {
		return nil
	} else if err != nil {
		return fmt.Errorf("%s: volatile mark: %w", l.id, err)
	}
	var buf [128]byte
	n, err := unix.Fgetxattr(l.fd, s.xattrName(volatileXattr), buf[:])
	if err != nil || string(buf[:n]) != s.boot {
		return fmt.Errorf("%s: %w", l.id, ErrVolatileLost)
	}
	if err := unix.Syncfs(l.fd); err != nil {
		return fmt.Errorf("%s: sync before clearing the volatile mark: %w", l.id, err)
	}
	if err := os.RemoveAll(mark); err != nil {
		return fmt.Errorf("%s: clear volatile mark: %w", l.id, err)
	}
	return nil
}

// plannedRefs are the layers whose diff directory this process handed
// out after planning a Get (see Store.planned), by ID.
type plannedRefs struct {
	mu sync.Mutex
	m  map[string]plannedRef
}

// plannedRef is a planned layer's slot, the generation the slot had when
// the plan was made, and the path Get hands out.
type plannedRef struct {
	slot, gen uint64
	path      string
}

// plannedMax bounds the plans kept; past it they are forgotten at once,
// and the next Get of each plans again.
const plannedMax = 1024

func (p *plannedRefs) get(id string) (plannedRef, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.m[id]
	return r, ok
}

func (p *plannedRefs) put(id string, r plannedRef) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil || len(p.m) >= plannedMax {
		p.m = make(map[string]plannedRef)
	}
	p.m[id] = r
}

// getPlanned takes a reference to the diff directory of id, which this
// process planned before, if nobody has held id's lock since: nothing
// that plan rests on (the layer's record, its holds, its children, its
// volatile mark) can have changed. It is one compare-and-swap.
func (s *Store) getPlanned(id string) (string, bool) {
	if s.refs == nil {
		return "", false
	}
	r, ok := s.planned.get(id)
	if !ok || !s.refs.add(r.slot, r.gen, 1) {
		return "", false
	}
	return r.path, true
}

// putPlanned drops a reference getPlanned could take: the plan holds,
// and the count is not zero.
func (s *Store) putPlanned(id string) bool {
	if s.refs == nil {
		return false
	}
	r, ok := s.planned.get(id)
	return ok && s.refs.add(r.slot, r.gen, -1)
}
