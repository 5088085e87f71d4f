package graph

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/ovlkit/ovlkit/ovl"
	"golang.org/x/sys/unix"
)

// LayerInfo describes one layer.
type LayerInfo struct {
	ID        string `json:"id"`
	Parent    string `json:"parent,omitempty"`
	RW        bool   `json:"rw"`
	Depth     int    `json:"depth"`
	Link      string `json:"link"`
	Committed bool   `json:"committed"`
	Applied   bool   `json:"applied"`
	Size      int64  `json:"size"`
	// NeedsApply: Repair reset the layer; ApplyDiff its tar again.
	NeedsApply bool      `json:"needs_apply,omitempty"`
	Created    time.Time `json:"created"`
	Mounts     int       `json:"mounts"`
	ReadOnly   bool      `json:"read_only,omitempty"`
	Path       string    `json:"path,omitempty"` // what Get returned, while referenced
	// Holds are the mounts callers made themselves (Acquire, View).
	Holds map[string]Hold `json:"holds,omitempty"`
}

func (s *Store) info(id string, r *layerRecord) (LayerInfo, error) {
	li := LayerInfo{ID: id, Parent: r.Parent, RW: r.RW, Depth: r.Depth, Link: r.Link, Committed: r.Committed,
		Applied: r.Applied, Size: r.Size, NeedsApply: r.NeedsApply, Created: r.Created}
	if len(r.Holds) > 0 {
		li.Holds = make(map[string]Hold, len(r.Holds))
		for n, h := range r.Holds {
			li.Holds[n] = h
		}
	}
	m, err := s.mountsOf(id)
	if err != nil {
		return li, err
	}
	li.Mounts, li.ReadOnly = m.Refs, m.ReadOnly
	if m.Refs > 0 {
		li.Path = s.rootPath(id, m)
	}
	return li, nil
}

// Create makes an empty image layer on parent ("" for none).
//
// ctx bounds the waits for the parent's lock and the store lock (Create
// takes the store lock before it starts and again to publish); a done ctx
// fails Create there and leaves the store as it was. The build of the
// layer itself, a copy of the parent's tree in the hardlink layout, runs
// to its end.
func (s *Store) Create(ctx context.Context, id, parent string) error {
	return s.CreateLayer(ctx, id, parent, CreateOptions{})
}

// CreateReadWrite makes an empty container layer on parent ("" for
// none); ctx is used as by Create.
func (s *Store) CreateReadWrite(ctx context.Context, id, parent string) error {
	return s.CreateLayer(ctx, id, parent, CreateOptions{ReadWrite: true})
}

// CreateOptions are the choices of CreateLayer.
type CreateOptions struct {
	// ReadWrite makes a container layer (CreateReadWrite), which is
	// mounted writable until it is committed or gets a child.
	ReadWrite bool
	// Owner, when set, owns the root of the new layer's diff (and of its
	// tree in the hardlink layout) instead of the parent's root owner:
	// the root of a container whose user namespace maps root elsewhere.
	Owner *Owner
}

// Owner is a numeric user and group.
type Owner struct{ UID, GID int }

// CreateLayer makes an empty layer on parent ("" for none) as o says;
// ctx is used as by Create.
func (s *Store) CreateLayer(ctx context.Context, id, parent string, o CreateOptions) (err error) {
	if err := validID(id); err != nil {
		return err
	}
	if o.Owner != nil && (o.Owner.UID < 0 || o.Owner.GID < 0) {
		return fmt.Errorf("create %s: invalid owner %d:%d", id, o.Owner.UID, o.Owner.GID)
	}
	rw := o.ReadWrite
	if parent != "" {
		pl, err := s.lockParent(ctx, id, parent)
		if err != nil {
			return err
		}
		defer pl.unlock()
	}
	var (
		parentTop string // the directory whose root metadata the child inherits
		snapshot  *state // the chain as it was when staging began
	)
	err = s.view(ctx, func(st *state) error {
		if _, err := s.checkCreate(st, id, parent); err != nil {
			return err
		}
		if parent != "" {
			if p := st.needsApply(parent); p != "" {
				return fmt.Errorf("create %s: parent's chain: %s: %w", id, p, ErrNeedsApply)
			}
			parentTop = s.topDir(st, parent)
			// Its writable holder would keep writing into what
			// becomes the child's lower.
			if h := st.Layers[parent].rwHolder(""); h != "" {
				return fmt.Errorf("create %s: parent %s is held writable by %s: %w", id, parent, h, ErrMounted)
			}
		}
		if err := s.checkDepth(st, id, parent, rw); err != nil {
			return err
		}
		snapshot = copyChain(st, parent)
		return nil
	})
	if err != nil {
		return err
	}

	stg, err := s.newLayerStage("create-"+id, parentTop)
	if err != nil {
		return fmt.Errorf("create %s: %w", id, err)
	}
	defer func() {
		if derr := stg.discard(); derr != nil && err == nil {
			err = fmt.Errorf("create %s: %w", id, derr)
		}
	}()
	if err := s.layout.build(s, snapshot, parent, rw, stg.dir, false); err != nil {
		return fmt.Errorf("create %s: %w", id, err)
	}
	if o.Owner != nil {
		if err := chownRoots(stg.dir, *o.Owner); err != nil {
			return fmt.Errorf("create %s: %w", id, err)
		}
	}
	// An empty manifest: Verify checks such a layer's structure only.
	if err := writeManifest(stg.dir, nil, false, s.log); err != nil {
		return fmt.Errorf("create %s: %w", id, err)
	}
	if s.sync == SyncFsync {
		if err := syncTree(stg.dir); err != nil {
			return fmt.Errorf("create %s: %w", id, err)
		}
	}
	return s.update(ctx, func(st *state) (bool, error) {
		return true, s.recordCreated(st, stg, id, parent, rw)
	})
}

// lockParent takes the lock of the parent of a layer being created, which
// keeps the parent from being removed, filled or mounted read-write while
// the child is built from it.
func (s *Store) lockParent(ctx context.Context, id, parent string) (*layerLock, error) {
	pl, err := s.lockLayer(ctx, parent)
	if err != nil {
		return nil, fmt.Errorf("create %s: parent %w", id, err)
	}
	pm, live, err := pl.liveMounts()
	switch {
	case err != nil:
		err = fmt.Errorf("create %s: parent %w", id, err)
	case live && !pm.ReadOnly:
		err = fmt.Errorf("create %s: parent %s is mounted read-write; unmount it first: %w", id, parent, ErrMounted)
	default:
		return pl, nil
	}
	pl.unlock()
	return nil, err
}

// checkCreate fails when id exists or its parent does not, and returns
// the new layer's depth.
func (s *Store) checkCreate(st *state, id, parent string) (int, error) {
	if _, ok := st.Layers[id]; ok {
		return 0, fmt.Errorf("create %s: %w", id, ErrExist)
	}
	if parent == "" {
		return 1, nil
	}
	p, ok := st.Layers[parent]
	if !ok {
		return 0, fmt.Errorf("create %s: parent %s: %w", id, parent, ErrNotExist)
	}
	return p.Depth + 1, nil
}

// recordCreated publishes the staged layer id with a fresh short link and
// records it in st; the caller holds the store lock.
func (s *Store) recordCreated(st *state, stg *layerStage, id, parent string, rw bool) error {
	depth, err := s.checkCreate(st, id, parent)
	if err != nil {
		return err
	}
	link, err := newLink(st.linkInUse)
	if err != nil {
		return err
	}
	if err := s.publish(stg, id, false); err != nil {
		return fmt.Errorf("create %s: %w", id, err)
	}
	// The name is fresh (newLink checked the state), so a plain symlink
	// will do; a stray of the same name fails it and the Create, to be
	// cleaned by the next Open.
	if err := os.Symlink("../layers/"+id+"/diff", s.linkPath(link)); err != nil {
		logCleanup(s.log, "unpublish layer", os.Rename(s.layerDir(id), stg.dir))
		return fmt.Errorf("create %s: %w", id, err)
	}
	if s.sync == SyncFsync {
		if err := syncDir(filepath.Join(s.home, "l")); err != nil {
			return err
		}
	}
	st.Layers[id] = &layerRecord{Parent: parent, RW: rw, Link: link, Depth: depth, Manifest: true, Created: time.Now().UTC()}
	if parent != "" {
		st.Layers[parent].Committed = true
	}
	return nil
}

// copyChain copies the records of id and its ancestors, so that a long
// build outside the lock works on a consistent picture.
func copyChain(st *state, id string) *state {
	c := &state{Layout: st.Layout, Layers: map[string]*layerRecord{}}
	for cur := id; cur != ""; {
		r, ok := st.Layers[cur]
		if !ok {
			break
		}
		rc := *r
		c.Layers[cur] = &rc
		cur = r.Parent
	}
	return c
}

// checkDepth refuses, at Create, a layer that could not be mounted: more
// lower layers than the kernel stacks, or mount data that does not fit a
// page even with the short relative names. The check builds the real
// configurations of both ways the layer will be mounted.
func (s *Store) checkDepth(st *state, id, parent string, rw bool) error {
	depth := 1
	if parent != "" {
		depth = st.Layers[parent].Depth + 1
	}
	if max := s.layout.maxDepth(); max > 0 && depth > max {
		return fmt.Errorf("create %s: the chain would be %d layers deep; overlayfs stacks at most %d: %w",
			id, depth, max, ErrTooDeep)
	}
	probe := &layerRecord{Parent: parent, RW: rw, Link: "XXXXXX", Depth: depth}
	st.Layers[id] = probe
	defer delete(st.Layers, id)
	for _, committed := range []bool{false, true} {
		probe.Committed = committed
		cfg, ro, err := s.mountConfig(st, id)
		if err != nil {
			return fmt.Errorf("create %s: %w", id, err)
		}
		if _, err := s.mounter.Method(cfg); err != nil {
			return fmt.Errorf("create %s: would not mount (%d lower layers, read-only=%v): %v: %w",
				id, len(cfg.Lower), ro, err, ErrTooDeep)
		}
	}
	return nil
}

// topDir is the directory holding the root of id's view: what a child's
// diff root copies its mode and owner from.
func (s *Store) topDir(st *state, id string) string {
	if s.layout.ownTree(st.Layers[id]) {
		return s.rootDir(id)
	}
	return s.diffDir(id)
}

// lowersOf returns the lower directories that show id's content in a
// mount, topmost first (see diskLayout.lowers).
func (s *Store) lowersOf(st *state, id string) ([]string, error) {
	chain, err := st.chain(id)
	if err != nil {
		return nil, err
	}
	return s.layout.lowers(s, st, chain, true), nil
}

// realLowersOf is lowersOf as real paths, for the tar code, which reports
// paths in its errors; id "" has none.
func (s *Store) realLowersOf(st *state, id string) ([]string, error) {
	if id == "" {
		return nil, nil
	}
	chain, err := st.chain(id)
	if err != nil {
		return nil, err
	}
	return s.layout.lowers(s, st, chain, false), nil
}

// mountConfig is how id is mounted now, and whether read-only.
func (s *Store) mountConfig(st *state, id string) (ovl.Config, bool, error) {
	r := st.Layers[id]
	cfg := ovl.Config{Base: filepath.Join(s.home, "l")}
	cfg.Options = append(append(cfg.Options, s.baseOptions()...), s.extraOpt...)
	readOnly := r.Committed || s.layout.ownTree(r)
	if readOnly {
		lowers, err := s.lowersOf(st, id)
		if err != nil {
			return cfg, true, err
		}
		if len(lowers) == 1 {
			lowers = append(lowers, s.emptyDir())
		}
		cfg.Lower = lowers
		cfg.Options = s.readOnlyOptions()
		// A view without upper is an image, not a container's root:
		// it is read, copied or built from, and no container runs from
		// it, so nothing in it may raise privilege or reach a device,
		// even for a process that was handed the mount. Containers
		// keep setuid and devices on their own read-write mounts,
		// which the store's modes keep from other users instead.
		cfg.NoSuid, cfg.NoDev = true, true
		return cfg, true, nil
	}
	cfg.Upper, cfg.Work = s.diffDir(id), s.workDir(id)
	if s.volatile {
		cfg.Options = append(cfg.Options, "volatile")
	}
	if r.Parent == "" {
		cfg.Lower = []string{s.emptyDir()}
		return cfg, false, nil
	}
	lowers, err := s.lowersOf(st, r.Parent)
	if err != nil {
		return cfg, false, err
	}
	cfg.Lower = lowers
	return cfg, false, nil
}

// Exists reports whether id is a layer of the store.
func (s *Store) Exists(id string) bool {
	found := false
	s.view(context.Background(), func(st *state) error {
		_, found = st.Layers[id]
		return nil
	})
	return found
}

// Layer describes id.
func (s *Store) Layer(id string) (LayerInfo, error) {
	var li LayerInfo
	err := s.view(context.Background(), func(st *state) error {
		r, ok := st.Layers[id]
		if !ok {
			return fmt.Errorf("%s: %w", id, ErrNotExist)
		}
		var err error
		li, err = s.info(id, r)
		return err
	})
	return li, err
}

// Layers lists every layer, sorted by depth and then ID, so parents come
// before their children.
func (s *Store) Layers() ([]LayerInfo, error) {
	var out []LayerInfo
	err := s.view(context.Background(), func(st *state) error {
		for id, r := range st.Layers {
			li, err := s.info(id, r)
			if err != nil {
				return err
			}
			out = append(out, li)
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool {
		if out[i].Depth != out[j].Depth {
			return out[i].Depth < out[j].Depth
		}
		return out[i].ID < out[j].ID
	})
	return out, err
}

// Remove deletes a layer that has no children and is not mounted.
//
// ctx bounds the waits for the layer's lock and the store lock; a done
// ctx fails Remove there, with the layer still in place. Once the state
// has forgotten the layer, its files are removed whatever ctx says.
func (s *Store) Remove(ctx context.Context, id string) error {
	l, m, live, err := s.lockMounts(ctx, "remove", id)
	if err != nil {
		return err
	}
	defer l.unlock()
	if live {
		return fmt.Errorf("remove %s: %w (%d references)", id, ErrMounted, m.Refs)
	}
	err = s.update(ctx, func(st *state) (bool, error) {
		r, ok := st.Layers[id]
		if !ok {
			return false, fmt.Errorf("remove %s: %w", id, ErrNotExist)
		}
		if kids := st.children(id); len(kids) > 0 {
			return false, fmt.Errorf("remove %s: %w: %v", id, ErrHasChildren, kids)
		}
		if len(r.Holds) > 0 {
			return false, fmt.Errorf("remove %s: %w (held by %v; Release first)", id, ErrMounted, sortedHolders(r.Holds))
		}
		// The state forgets the layer first: if the rename below never
		// happens, recovery removes the directory that has no record. The
		// link goes now, under the lock, before a new layer can reuse its
		// name; recovery would remake it if the state write failed.
		delete(st.Layers, id)
		if err := os.Remove(s.linkPath(r.Link)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return false, fmt.Errorf("remove %s: %w", id, err)
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	// Its slot in the reference table goes with the unlock, after the
	// claim that tells every plan of it that it changed.
	l.freeSlot = l.hasSlot
	// Move the directory away in one rename, then delete it: a crash
	// after this point leaves only staging garbage. The trash needs no
	// lock of its own: an Open that removes it first only saves work.
	for {
		trash := filepath.Join(s.home, "staging", fmt.Sprintf("remove-%s-%016x", id, rand.Uint64()))
		err := os.Rename(s.layerDir(id), trash)
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
			continue // a leftover of the same name
		}
		if err != nil {
			return fmt.Errorf("remove %s: %w", id, err)
		}
		// The layer is gone from the state already; a leftover is
		// reclaimed by the next Open, but the caller should know.
		if err := removeAll(trash, s.log); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s: layer removed, files left in staging: %w", id, err)
		}
		return nil
	}
}

// Get mounts id (on first use) and returns the path of its root. Every Get
// needs a Put. A writable layer without a parent is not mounted: its root
// is its diff directory (see direct), and once this process has handed it
// out, the next Get takes the reference without the lock while nobody has
// held the lock since (see refTable).
//
// ctx bounds the waits for the layer's lock and, when the state changed
// since this process last read it, the store lock; it is checked once
// more right before the mount. A done ctx fails Get there with nothing
// mounted. Once mounted, Get finishes: undoing the mount would cost more
// than recording it.
func (s *Store) Get(ctx context.Context, id string) (string, error) {
	if p, ok := s.getPlanned(id); ok {
		return p, nil
	}
	l, m, live, err := s.lockMounts(ctx, "get", id)
	if err != nil {
		return "", err
	}
	p, planned, err := s.getLocked(ctx, l, id, m, live)
	l.unlock()
	if err == nil && planned && l.hasSlot {
		s.planned.put(id, plannedRef{slot: l.slot, gen: l.gen, path: p})
	}
	return p, err
}

// getLocked is Get under id's lock l, with the mount record m and
// whether it is live; planned says the diff directory was handed out
// after a new plan, which the next Get can take as it is while nobody
// holds the lock meanwhile.
func (s *Store) getLocked(ctx context.Context, l *layerLock, id string, m mountRecord, live bool) (string, bool, error) {
	if live {
		m.Refs++
		if err := l.setMounts(m); err != nil {
			return "", false, fmt.Errorf("get: %w", err)
		}
		return s.rootPath(id, m), false, nil
	}
	// No mount, or a count left by a crashed process: mount afresh.
	plan, err := s.planGet(ctx, id)
	if err != nil {
		return "", false, err
	}
	if plan.direct {
		p, err := s.getDirect(ctx, l, id, plan.written)
		return p, err == nil, err
	}
	p, err := s.mountForGet(ctx, l, id, plan)
	return p, false, err
}

// A getPlan is how Get hands out a layer that nobody has mounted.
type getPlan struct {
	cfg     ovl.Config
	ro      bool // mount read-only
	written bool // the first writable mount of an applied layer
	direct  bool // hand out the diff directory, no mount
}

// planGet reads what Get needs from the state. The layer's lock keeps its
// record, its chain and its children as they are, so the state as last
// seen serves when nobody changed it.
func (s *Store) planGet(ctx context.Context, id string) (getPlan, error) {
	var p getPlan
	err := s.peek(ctx, func(st *state) error {
		r, ok := st.Layers[id]
		if !ok {
			return fmt.Errorf("get %s: %w", id, ErrNotExist)
		}
		if a := st.needsApply(id); a != "" {
			return fmt.Errorf("get %s: %s: %w", id, a, ErrNeedsApply)
		}
		var err error
		if p.cfg, p.ro, err = s.mountConfig(st, id); err != nil {
			return fmt.Errorf("get %s: %w", id, err)
		}
		// A writable mount beside a caller's own mount of the layer
		// would share its upper, or write into its lower.
		if !p.ro && len(r.Holds) > 0 {
			return fmt.Errorf("get %s: held by %v: %w", id, sortedHolders(r.Holds), ErrMounted)
		}
		p.written = !p.ro && r.Applied && !r.Written
		p.direct = s.direct(r, p.ro)
		return nil
	})
	return p, err
}

// mountForGet mounts the layer as p says, records the written flag and
// the first reference, and returns the mount point.
func (s *Store) mountForGet(ctx context.Context, l *layerLock, id string, p getPlan) (string, error) {
	merged := s.mergedDir(id)
	if s.volatile && !p.ro {
		if err := s.prepareVolatile(l); err != nil {
			return "", fmt.Errorf("get: %w", err)
		}
	}
	// The mount point's directory, the layer's, keeps everyone but the
	// owner from the mount (see ownerOnly).
	if err := os.Mkdir(merged, ownerOnly); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("get %s: %w", id, err)
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("get %s: %w", id, err)
	}
	if err := s.mounter.Mount(merged, p.cfg, p.ro); err != nil {
		return "", fmt.Errorf("get %s: %w", id, err)
	}
	var err error
	if p.written {
		// Recorded before Get hands out the path, so before anything
		// is written through the mount: Check must not hold the
		// content against the applied size from then on.
		err = s.update(context.WithoutCancel(ctx), func(st *state) (bool, error) {
			st.Layers[id].Written = true
			return true, nil
		})
	}
	if err == nil {
		err = l.setMounts(mountRecord{Refs: 1, ReadOnly: p.ro})
	}
	if err != nil {
		logCleanup(s.log, "unmount after failed get", s.unmount(merged))
		return "", fmt.Errorf("get %s: %w", id, err)
	}
	return merged, nil
}

// Put drops one reference taken by Get and unmounts at zero; a reference
// to a diff directory that Get could take without the lock is dropped
// the same way.
//
// ctx bounds the wait for the layer's lock; a done ctx fails Put there
// with the reference still held. Once the lock is held, Put finishes.
func (s *Store) Put(ctx context.Context, id string) error {
	if s.putPlanned(id) {
		return nil
	}
	l, m, live, err := s.lockMounts(ctx, "put", id)
	if err != nil {
		return err
	}
	defer l.unlock()
	if m.Refs == 0 {
		return fmt.Errorf("put %s: %w", id, ErrNotMounted)
	}
	if live && m.Refs > 1 {
		m.Refs--
		if err := l.setMounts(m); err != nil {
			return fmt.Errorf("put: %w", err)
		}
		return nil
	}
	if !m.Dir {
		if err := s.unmount(s.mergedDir(id)); err != nil {
			return fmt.Errorf("put %s: %w", id, err)
		}
	}
	if err := l.setMounts(mountRecord{}); err != nil {
		return fmt.Errorf("put: %w", err)
	}
	return nil
}

// unmount detaches the mount at merged and removes the directory. The
// detach reaches copies of the mount that other mount namespaces made
// meanwhile (a container runtime's), and removing the mount point makes
// the kernel drop those copies, so that a later Remove or mount of the
// same directories does not fail with EBUSY (moby #34672).
func (s *Store) unmount(merged string) error {
	if err := unix.Unmount(merged, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", merged, err)
	}
	if err := os.Remove(merged); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove mount point %s: %w", merged, err)
	}
	return nil
}

// Cleanup unmounts every layer of the store whatever its reference count,
// for shutdown.
func (s *Store) Cleanup() error {
	var ids []string
	if err := s.view(context.Background(), func(st *state) error {
		for id := range st.Layers {
			ids = append(ids, id)
		}
		return nil
	}); err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		if err := s.forceUnmount(id); err != nil && !errors.Is(err, ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// forceUnmount unmounts id whatever its count and clears the count.
func (s *Store) forceUnmount(id string) error {
	l, err := s.lockLayer(context.Background(), id)
	if err != nil {
		return err
	}
	defer l.unlock()
	m, err := l.mounts()
	if err != nil {
		return err
	}
	if m.Refs == 0 && !isMounted(s.mergedDir(id)) {
		return nil
	}
	if err := s.unmount(s.mergedDir(id)); err != nil {
		return err
	}
	return l.setMounts(mountRecord{})
}
