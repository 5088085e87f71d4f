// Package snapshotter serves an ovlkit layer store as a containerd
// snapshotter (snapshots.Snapshotter), for containerd's proxy plugins and
// Docker's containerd image store.
//
// Names, parents, kinds, labels, timestamps and the usage of committed
// snapshots live in containerd's own bolt metadata store
// (core/snapshots/storage), the one containerd's overlay snapshotter uses:
// containerd's semantics of keys, Walk filters, Update field paths and
// kind transitions come with it, tested by containerd. The content of
// every snapshot that has one is a layer of the graph store, named after
// the snapshot's metadata ID (sn-ID); the store's state stays the truth
// about layers, their chains and who mounts them. Open reconciles the two.
//
// Active snapshots are writable container layers that the snapshotter
// holds (graph.Store.Acquire) until they are committed or removed;
// committed snapshots are frozen layers (Commit); views are read-only
// holds on their parent's layer (graph.Store.View), which cost no depth.
package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/ovl"
)

// Config configures Open.
type Config struct {
	// StrictUpper: mounts carry the series' strict_upper where the kernel
	// has it (auto, the default), always (on: Open fails without) or
	// never (off).
	StrictUpper graph.FeatureUse
	// FsyncStrict mounts container snapshots with the series'
	// fsync=strict; Open fails on a kernel without it.
	FsyncStrict bool
	// MountOptions are added to every overlay mount (redirect_dir=on,
	// for instance); see graph.Options.MountOptions.
	MountOptions []string
	// Sync is the store's durability policy (graph.SyncFsync by default).
	Sync graph.SyncPolicy
	// AsyncRemove makes Remove drop the metadata only; Cleanup removes
	// the layers, as containerd's overlay snapshotter does with the same
	// option, so that removing many snapshots does not wait for disks.
	AsyncRemove bool
	// Features replaces the store's kernel probe (which mounts, and so
	// needs root), for callers that probed already.
	Features *ovl.Features
	// Logger gets what reconciliation and best-effort removals did; nil
	// discards.
	Logger *slog.Logger
}

// Snapshotter is an ovlkit store behind containerd's snapshotter
// interface.
type Snapshotter struct {
	root  string
	store *graph.Store
	ms    *storage.MetaStore
	async bool
	log   *slog.Logger
}

var (
	_ snapshots.Snapshotter = (*Snapshotter)(nil)
	_ snapshots.Cleaner     = (*Snapshotter)(nil)
)

// Open opens (or creates) the snapshotter in root: root/metadata.db, the
// bolt metadata, and root/store, the layer store. It reconciles both
// before it returns: see Reconcile.
func Open(ctx context.Context, root string, cfg Config) (*Snapshotter, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("snapshotter root: %w", err)
	}
	st, err := graph.Open(filepath.Join(root, "store"), graph.Options{
		Create: true, Layout: graph.LayoutOverlay, Sync: cfg.Sync, FsyncStrict: cfg.FsyncStrict,
		StrictUpper: cfg.StrictUpper, MountOptions: cfg.MountOptions, Features: cfg.Features, Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("open layer store: %w", err)
	}
	ms, err := storage.NewMetaStore(filepath.Join(root, "metadata.db"))
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("open snapshot metadata: %w", err)
	}
	s := &Snapshotter{root: root, store: st, ms: ms, async: cfg.AsyncRemove, log: log}
	if _, err := s.Reconcile(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Store is the layer store behind the snapshotter.
func (s *Snapshotter) Store() *graph.Store { return s.store }

// layerID is the store layer of the snapshot with metadata ID id.
func layerID(id string) string { return "sn-" + id }

// idOfLayer is the metadata ID of a store layer, or "" for a layer that
// is not a snapshot's.
func idOfLayer(l string) string {
	id, ok := strings.CutPrefix(l, "sn-")
	if !ok {
		return ""
	}
	if _, err := strconv.ParseUint(id, 10, 64); err != nil {
		return ""
	}
	return id
}

// Holders of the store's holds: an active snapshot holds its own layer
// writable; a view holds its parent's layer read-only.
func activeHolder(id string) string { return "active-" + id }
func viewHolder(id string) string   { return "view-" + id }

// Stat returns the info of a snapshot by key or name.
func (s *Snapshotter) Stat(ctx context.Context, key string) (info snapshots.Info, err error) {
	err = s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		_, info, _, err = storage.GetInfo(ctx, key)
		return err
	})
	return info, err
}

// Update changes the mutable fields (labels) of a snapshot.
func (s *Snapshotter) Update(ctx context.Context, info snapshots.Info, fieldpaths ...string) (out snapshots.Info, err error) {
	err = s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		out, err = storage.UpdateInfo(ctx, info, fieldpaths...)
		return err
	})
	return out, err
}

// Usage is the disk usage of a snapshot's own changes: measured now for
// an active snapshot, as recorded at commit for a committed one.
func (s *Snapshotter) Usage(ctx context.Context, key string) (snapshots.Usage, error) {
	var (
		id    string
		info  snapshots.Info
		usage snapshots.Usage
	)
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		var err error
		id, info, usage, err = storage.GetInfo(ctx, key)
		return err
	})
	if err != nil {
		return usage, err
	}
	if info.Kind == snapshots.KindActive {
		u, err := s.store.DiskUsage(ctx, layerID(id))
		if err != nil {
			return snapshots.Usage{}, storeErr(err)
		}
		usage = snapshots.Usage{Size: u.Bytes, Inodes: u.Inodes}
	}
	return usage, nil
}

// Walk calls fn for every snapshot that matches one of the filters.
func (s *Snapshotter) Walk(ctx context.Context, fn snapshots.WalkFunc, filters ...string) error {
	return s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		return storage.WalkInfo(ctx, fn, filters...)
	})
}

// Prepare makes an active snapshot on parent and returns its mounts.
func (s *Snapshotter) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	return s.create(ctx, snapshots.KindActive, key, parent, opts)
}

// View makes a read-only snapshot of parent and returns its mounts.
func (s *Snapshotter) View(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	return s.create(ctx, snapshots.KindView, key, parent, opts)
}

func (s *Snapshotter) create(ctx context.Context, kind snapshots.Kind, key, parent string, opts []snapshots.Opt) ([]mount.Mount, error) {
	var mounts []mount.Mount
	err := s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		sn, err := storage.CreateSnapshot(ctx, kind, key, parent, opts...)
		if err != nil {
			return err
		}
		parentLayer := ""
		if len(sn.ParentIDs) > 0 {
			parentLayer = layerID(sn.ParentIDs[0])
		}
		// The metadata is rolled back with an error; what was made in
		// the store is undone here, or else by the next Reconcile.
		if kind == snapshots.KindView && parentLayer != "" {
			spec, err := s.store.View(ctx, parentLayer, viewHolder(sn.ID))
			if err != nil {
				return storeErr(err)
			}
			mounts = toMounts(spec)
			return nil
		}
		var info snapshots.Info
		for _, o := range opts {
			if err := o(&info); err != nil {
				return err
			}
		}
		owner, err := ownerOf(info.Labels)
		if err != nil {
			return err
		}
		l := layerID(sn.ID)
		if err := s.store.CreateLayer(ctx, l, parentLayer, graph.CreateOptions{ReadWrite: kind == snapshots.KindActive, Owner: owner}); err != nil {
			return storeErr(err)
		}
		var spec graph.MountSpec
		if kind == snapshots.KindActive {
			spec, err = s.store.Acquire(ctx, l, activeHolder(sn.ID))
		} else {
			// A view of nothing: an empty layer, frozen and viewed.
			if err = s.store.Commit(ctx, l); err == nil {
				spec, err = s.store.View(ctx, l, viewHolder(sn.ID))
			}
		}
		if err != nil {
			s.undoLayer(ctx, l)
			return storeErr(err)
		}
		mounts = toMounts(spec)
		return nil
	})
	return mounts, err
}

// undoLayer removes a layer made by a call that failed, holds first.
func (s *Snapshotter) undoLayer(ctx context.Context, l string) {
	ctx = context.WithoutCancel(ctx)
	if li, err := s.store.Layer(l); err == nil {
		for h := range li.Holds {
			s.logErr("release hold after a failure", s.store.Release(ctx, l, h))
		}
	}
	s.logErr("remove layer after a failure", s.store.Remove(ctx, l))
}

func (s *Snapshotter) logErr(what string, err error) {
	if err != nil {
		s.log.Warn("ovlkit snapshotter: "+what, "err", err)
	}
}

// Mounts returns the mounts of an active snapshot or a view.
func (s *Snapshotter) Mounts(ctx context.Context, key string) ([]mount.Mount, error) {
	var sn storage.Snapshot
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		var err error
		sn, err = storage.GetSnapshot(ctx, key)
		return err
	})
	if err != nil {
		return nil, err
	}
	// Holding again under the same name records nothing: it returns
	// the spec, and puts back a hold that reconciliation found missing.
	var spec graph.MountSpec
	switch {
	case sn.Kind == snapshots.KindView && len(sn.ParentIDs) > 0:
		spec, err = s.store.View(ctx, layerID(sn.ParentIDs[0]), viewHolder(sn.ID))
	case sn.Kind == snapshots.KindView:
		spec, err = s.store.View(ctx, layerID(sn.ID), viewHolder(sn.ID))
	default:
		spec, err = s.store.Acquire(ctx, layerID(sn.ID), activeHolder(sn.ID))
	}
	if err != nil {
		return nil, storeErr(err)
	}
	return toMounts(spec), nil
}

// Commit turns the active snapshot key into the committed snapshot name:
// its layer is released and frozen, and its usage recorded.
func (s *Snapshotter) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	return s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		sn, err := storage.GetSnapshot(ctx, key)
		if err != nil {
			return err
		}
		if sn.Kind != snapshots.KindActive {
			return fmt.Errorf("snapshot %s is not active: %w", key, errdefs.ErrFailedPrecondition)
		}
		l := layerID(sn.ID)
		u, err := s.store.DiskUsage(ctx, l)
		if err != nil {
			return storeErr(err)
		}
		if _, err := storage.CommitActive(ctx, key, name, snapshots.Usage{Size: u.Bytes, Inodes: u.Inodes}, opts...); err != nil {
			return err
		}
		if err := s.store.Release(ctx, l, activeHolder(sn.ID)); err != nil && !errors.Is(err, graph.ErrNotMounted) {
			return storeErr(err)
		}
		if err := s.store.Commit(ctx, l); err != nil {
			// The metadata stays active: give the layer its hold back.
			_, aerr := s.store.Acquire(context.WithoutCancel(ctx), l, activeHolder(sn.ID))
			s.logErr("hold again after a failed commit", aerr)
			return storeErr(err)
		}
		return nil
	})
}

// Remove deletes a snapshot. Its layer goes at once, or with AsyncRemove
// at the next Cleanup.
func (s *Snapshotter) Remove(ctx context.Context, key string) error {
	var (
		id, parentID string
		kind         snapshots.Kind
	)
	err := s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		_, info, _, err := storage.GetInfo(ctx, key)
		if err != nil {
			return err
		}
		if info.Kind == snapshots.KindView && info.Parent != "" {
			if parentID, _, _, err = storage.GetInfo(ctx, info.Parent); err != nil {
				return err
			}
		}
		if id, kind, err = storage.Remove(ctx, key); err != nil {
			return err
		}
		held, holder := layerID(id), activeHolder(id)
		switch {
		case kind == snapshots.KindView && parentID != "":
			held, holder = layerID(parentID), viewHolder(id)
		case kind == snapshots.KindView:
			holder = viewHolder(id)
		case kind != snapshots.KindActive:
			return nil
		}
		if err := s.store.Release(ctx, held, holder); err != nil && !errors.Is(err, graph.ErrNotMounted) && !errors.Is(err, graph.ErrNotExist) {
			return storeErr(err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if s.async || parentID != "" {
		return nil
	}
	// The metadata is gone; a layer that cannot go now is an orphan that
	// Cleanup and the next Open remove.
	if err := s.store.Remove(ctx, layerID(id)); err != nil && !errors.Is(err, graph.ErrNotExist) {
		s.logErr("remove layer of "+key+" (left for Cleanup)", err)
	}
	return nil
}

// Cleanup removes the layers no snapshot has, children before parents
// (what AsyncRemove left, and what a crash did), and holds of snapshots
// that are gone.
func (s *Snapshotter) Cleanup(ctx context.Context) error {
	_, err := s.Reconcile(ctx)
	return err
}

// Close closes the metadata and the store. Mounts made from the
// snapshots' specs are the caller's and stay.
func (s *Snapshotter) Close() error {
	err := s.ms.Close()
	if cerr := s.store.Close(); err == nil {
		err = cerr
	}
	return err
}

// toMounts turns a store spec into containerd's mount.
func toMounts(spec graph.MountSpec) []mount.Mount {
	return []mount.Mount{{Type: spec.Type, Source: spec.Source, Options: append([]string(nil), spec.Options...)}}
}

// storeErr maps the store's errors onto containerd's error classes, so
// that clients (and the gRPC status codes) see what went wrong.
func storeErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, graph.ErrNotExist):
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	case errors.Is(err, graph.ErrExist):
		return fmt.Errorf("%w: %w", err, errdefs.ErrAlreadyExists)
	case errors.Is(err, graph.ErrMounted), errors.Is(err, graph.ErrHasChildren), errors.Is(err, graph.ErrNeedsApply):
		return fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
	case errors.Is(err, graph.ErrTooDeep), errors.Is(err, graph.ErrInvalidID):
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	return err
}

// Labels of containerd's user-namespace remapping: "CONTAINER:HOST:SIZE".
const (
	uidMapLabel = "containerd.io/snapshot/uidmapping"
	gidMapLabel = "containerd.io/snapshot/gidmapping"
)

// ownerOf is the host owner of a new snapshot's root from the remapping
// labels (container root mapped to HOST), or nil without them.
func ownerOf(labels map[string]string) (*graph.Owner, error) {
	u, hasU := labels[uidMapLabel]
	g, hasG := labels[gidMapLabel]
	if !hasU && !hasG {
		return nil, nil
	}
	if !hasU || !hasG {
		return nil, fmt.Errorf("labels %s and %s go together: %w", uidMapLabel, gidMapLabel, errdefs.ErrInvalidArgument)
	}
	uid, err := rootOf(u)
	if err != nil {
		return nil, fmt.Errorf("label %s: %w", uidMapLabel, err)
	}
	gid, err := rootOf(g)
	if err != nil {
		return nil, fmt.Errorf("label %s: %w", gidMapLabel, err)
	}
	return &graph.Owner{UID: uid, GID: gid}, nil
}

// rootOf finds the host ID of container ID 0 in a mapping list
// "C:H:N[,C:H:N...]".
func rootOf(m string) (int, error) {
	for _, e := range strings.Split(m, ",") {
		f := strings.Split(e, ":")
		if len(f) != 3 {
			return 0, fmt.Errorf("mapping %q is not CONTAINER:HOST:SIZE: %w", e, errdefs.ErrInvalidArgument)
		}
		var n [3]uint64
		for i, x := range f {
			v, err := strconv.ParseUint(x, 10, 32)
			if err != nil {
				return 0, fmt.Errorf("mapping %q: %w", e, errdefs.ErrInvalidArgument)
			}
			n[i] = v
		}
		if n[0] == 0 && n[2] > 0 {
			return int(n[1]), nil
		}
	}
	return 0, fmt.Errorf("mapping %q does not map container root: %w", m, errdefs.ErrInvalidArgument)
}
