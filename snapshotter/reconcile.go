package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"

	"github.com/ovlkit/ovlkit/graph"
)

// Report is what Reconcile changed.
type Report struct {
	// Snapshots removed from the metadata because their layer (or an
	// ancestor's) is gone from the store: their content is lost.
	Snapshots []string `json:"snapshots,omitempty"`
	// Layers removed from the store because no snapshot has them: left
	// by AsyncRemove, by a crash between the two stores, or by a
	// removal that failed.
	Layers []string `json:"layers,omitempty"`
	// Released are holds ("layer/holder") of snapshots that are gone.
	Released []string `json:"released,omitempty"`
	// Restored are holds an active snapshot or a view lacked.
	Restored []string `json:"restored,omitempty"`
	// Frozen are active snapshots whose layer is committed: a crash
	// between the store's Commit and the metadata's, whose committed
	// name is lost. They mount read-only; remove them.
	Frozen []string `json:"frozen,omitempty"`
}

// hold is one hold the metadata says the store should have.
type hold struct{ layer, holder string }

// snap is one snapshot as the metadata has it.
type snap struct {
	key string
	storage.Snapshot
}

// Reconcile makes the metadata and the store agree, in both directions.
// A snapshot whose layer, or an ancestor's, is gone from the store is
// removed from the metadata with its descendants (deepest first); a layer
// of the store that no snapshot has is removed (children first), and so
// are holds of snapshots that are gone; an active snapshot or a view
// whose hold is missing gets it again. It runs in a write transaction of
// the metadata, so no other change interleaves. Open calls it; so does
// Cleanup.
func (s *Snapshotter) Reconcile(ctx context.Context) (Report, error) {
	var rep Report
	err := s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		snaps, err := s.snapshots(ctx)
		if err != nil {
			return err
		}
		layers, err := s.store.Layers()
		if err != nil {
			return fmt.Errorf("reconcile: %w", err)
		}
		have := map[string]graph.LayerInfo{}
		for _, l := range layers {
			have[l.ID] = l
		}
		if err := s.dropLost(ctx, snaps, have, &rep); err != nil {
			return err
		}
		if snaps, err = s.snapshots(ctx); err != nil {
			return err
		}
		wantLayers, wantHolds := wanted(snaps)
		s.dropOrphans(ctx, layers, wantLayers, wantHolds, &rep)
		return s.restoreHolds(ctx, snaps, wantHolds, have, &rep)
	})
	if err != nil {
		return rep, fmt.Errorf("reconcile snapshots with layers: %w", err)
	}
	for _, what := range []struct {
		name string
		list []string
	}{{"removed lost snapshots", rep.Snapshots}, {"removed orphan layers", rep.Layers},
		{"released holds", rep.Released}, {"restored holds", rep.Restored},
		{"active snapshots with a committed layer (remove them)", rep.Frozen}} {
		if len(what.list) > 0 {
			s.log.Info("ovlkit snapshotter: "+what.name, "which", strings.Join(what.list, " "))
		}
	}
	return rep, nil
}

// snapshots lists every snapshot of the metadata.
func (s *Snapshotter) snapshots(ctx context.Context) (map[string]snap, error) {
	ids, err := storage.IDMap(ctx)
	if errdefs.IsNotFound(err) {
		return map[string]snap{}, nil // a new store: no bucket yet
	}
	if err != nil {
		return nil, err
	}
	out := make(map[string]snap, len(ids))
	byName := map[string]string{}
	parent := map[string]string{}
	for id, key := range ids {
		gid, info, _, err := storage.GetInfo(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", key, err)
		}
		if gid != id {
			return nil, fmt.Errorf("snapshot %s: ID %s, the index says %s", key, gid, id)
		}
		out[id] = snap{key: key, Snapshot: storage.Snapshot{ID: id, Kind: info.Kind}}
		byName[key] = id
		parent[id] = info.Parent
	}
	// Every ancestor, nearest first, as storage.Snapshot has them.
	for id, sn := range out {
		for p := parent[id]; p != "" && len(sn.ParentIDs) <= len(out); p = parent[byName[p]] {
			pid, ok := byName[p]
			if !ok {
				return nil, fmt.Errorf("snapshot %s: parent %s: %w", sn.key, p, errdefs.ErrNotFound)
			}
			sn.ParentIDs = append(sn.ParentIDs, pid)
		}
		out[id] = sn
	}
	return out, nil
}

// ownLayer is the layer holding a snapshot's content, or "" for a view
// of a parent, which has none.
func (sn snap) ownLayer() string {
	if sn.Kind == snapshots.KindView && len(sn.ParentIDs) > 0 {
		return ""
	}
	return layerID(sn.ID)
}

// hold is the hold the snapshot keeps, if it keeps one.
func (sn snap) hold() (hold, bool) {
	switch {
	case sn.Kind == snapshots.KindActive:
		return hold{layerID(sn.ID), activeHolder(sn.ID)}, true
	case sn.Kind == snapshots.KindView && len(sn.ParentIDs) > 0:
		return hold{layerID(sn.ParentIDs[0]), viewHolder(sn.ID)}, true
	case sn.Kind == snapshots.KindView:
		return hold{layerID(sn.ID), viewHolder(sn.ID)}, true
	}
	return hold{}, false
}

func wanted(snaps map[string]snap) (map[string]bool, map[hold]bool) {
	layers, holds := map[string]bool{}, map[hold]bool{}
	for _, sn := range snaps {
		if l := sn.ownLayer(); l != "" {
			layers[l] = true
		}
		if h, ok := sn.hold(); ok {
			holds[h] = true
		}
	}
	return layers, holds
}

// dropLost removes from the metadata the snapshots whose content is gone
// and everything built on them.
func (s *Snapshotter) dropLost(ctx context.Context, snaps map[string]snap, have map[string]graph.LayerInfo, rep *Report) error {
	lost := map[string]bool{}
	for id, sn := range snaps {
		if l := sn.ownLayer(); l != "" {
			if _, ok := have[l]; !ok {
				lost[id] = true
			}
		}
	}
	if len(lost) == 0 {
		return nil
	}
	var drop []snap
	for id, sn := range snaps {
		gone := lost[id]
		for _, p := range sn.ParentIDs {
			gone = gone || lost[p]
		}
		if gone {
			drop = append(drop, sn)
		}
	}
	// Children before parents: every ancestor is in ParentIDs.
	sort.Slice(drop, func(i, j int) bool { return len(drop[i].ParentIDs) > len(drop[j].ParentIDs) })
	for _, sn := range drop {
		if _, _, err := storage.Remove(ctx, sn.key); err != nil {
			return fmt.Errorf("remove lost snapshot %s: %w", sn.key, err)
		}
		rep.Snapshots = append(rep.Snapshots, sn.key)
	}
	return nil
}

// dropOrphans releases the holds and removes the layers that no snapshot
// accounts for. Layers without the snapshots' names are not ours and
// stay. Failures are logged: what stays is tried again next time.
func (s *Snapshotter) dropOrphans(ctx context.Context, layers []graph.LayerInfo, wantLayers map[string]bool, wantHolds map[hold]bool, rep *Report) {
	for _, l := range layers {
		if idOfLayer(l.ID) == "" {
			continue
		}
		for h := range l.Holds {
			if !ours(h) || wantHolds[hold{l.ID, h}] {
				continue
			}
			if err := s.store.Release(ctx, l.ID, h); err != nil && !errors.Is(err, graph.ErrNotMounted) {
				s.logErr("release hold "+l.ID+"/"+h, err)
				continue
			}
			rep.Released = append(rep.Released, l.ID+"/"+h)
		}
	}
	// Layers() lists parents first; remove from the end.
	for i := len(layers) - 1; i >= 0; i-- {
		l := layers[i]
		if idOfLayer(l.ID) == "" || wantLayers[l.ID] {
			continue
		}
		if err := s.store.Remove(ctx, l.ID); err != nil {
			s.logErr("remove orphan layer "+l.ID, err)
			continue
		}
		rep.Layers = append(rep.Layers, l.ID)
	}
}

// ours reports whether a holder name is one the snapshotter gives.
func ours(holder string) bool {
	return strings.HasPrefix(holder, "active-") || strings.HasPrefix(holder, "view-")
}

// restoreHolds takes again the holds that active snapshots and views
// should have.
func (s *Snapshotter) restoreHolds(ctx context.Context, snaps map[string]snap, want map[hold]bool, have map[string]graph.LayerInfo, rep *Report) error {
	for _, sn := range snaps {
		h, ok := sn.hold()
		if !ok || !want[h] {
			continue
		}
		if li, ok := have[h.layer]; ok && sn.Kind == snapshots.KindActive && li.Committed {
			rep.Frozen = append(rep.Frozen, sn.key)
		}
		if li, ok := have[h.layer]; ok {
			if _, held := li.Holds[h.holder]; held {
				continue
			}
		}
		var err error
		if sn.Kind == snapshots.KindActive {
			_, err = s.store.Acquire(ctx, h.layer, h.holder)
		} else {
			_, err = s.store.View(ctx, h.layer, h.holder)
		}
		if err != nil {
			return fmt.Errorf("restore hold of %s: %w", sn.key, storeErr(err))
		}
		rep.Restored = append(rep.Restored, h.layer+"/"+h.holder)
	}
	return nil
}
