package graph

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// Repair fixes what Verify finds wrong with layer id and returns what
// Verify finds afterwards.
//
// What the store derives is made again in place: the short link under l/
// (and l/ itself), a missing work/, the record's depth and committed mark,
// and the manifest of a layer that has no applied content for it to
// describe. A layer whose content is lost (a file truncated, zero-filled,
// removed or changed, diff/ or the manifest gone) is reset: its directory
// is replaced by an empty one, as Create made it, with one exchange, and
// its record is kept in StateNeedsApply, so that the caller applies the
// same tar again with ApplyDiff. Until then the layer and its descendants
// cannot be mounted, diffed or built upon (ErrNeedsApply). Nothing else
// changes: parent, siblings and children keep their content.
//
// Repair refuses while the layer or a descendant is mounted (ErrMounted),
// a layer whose content was written after apply (its tar would not give
// it back), a layer whose parent itself waits for its tar, and, in the
// hardlink layout, a layer with children, whose trees share its files.
func (s *Store) Repair(ctx context.Context, id string) (Report, error) {
	if err := validID(id); err != nil {
		return Report{}, err
	}
	if err := s.ensureLayerDir(ctx, id); err != nil {
		return Report{}, err
	}
	rep, err := s.repairLocked(ctx, id)
	if err != nil {
		return rep, err
	}
	return s.Verify(ctx, id)
}

// ensureLayerDir gives a recorded layer whose directory is gone an empty
// one, so that it has a lock and its reset something to exchange with.
func (s *Store) ensureLayerDir(ctx context.Context, id string) error {
	return s.view(ctx, func(st *state) error {
		if _, ok := st.Layers[id]; !ok {
			return fmt.Errorf("repair %s: %w", id, ErrNotExist)
		}
		if err := os.Mkdir(s.layerDir(id), ownerOnly); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("repair %s: %w", id, err)
		}
		return nil
	})
}

func (s *Store) repairLocked(ctx context.Context, id string) (Report, error) {
	locks, err := s.lockSubtree(ctx, id)
	if err != nil {
		return Report{}, fmt.Errorf("repair %s: %w", id, err)
	}
	defer func() {
		for _, l := range locks {
			l.unlock()
		}
	}()
	for _, l := range locks {
		m, live, err := l.liveMounts()
		if err != nil {
			return Report{}, fmt.Errorf("repair %s: %w", id, err)
		}
		if live {
			return Report{}, fmt.Errorf("repair %s: %s is mounted (%d references): %w", id, l.id, m.Refs, ErrMounted)
		}
	}
	if err := s.view(ctx, func(st *state) error {
		for _, l := range locks {
			if r, ok := st.Layers[l.id]; ok && len(r.Holds) > 0 {
				return fmt.Errorf("repair %s: %s is held by %v: %w", id, l.id, sortedHolders(r.Holds), ErrMounted)
			}
		}
		return nil
	}); err != nil {
		return Report{}, err
	}
	rep, err := s.verifyLocked(ctx, id)
	if err != nil || len(rep.Damage) == 0 {
		return rep, err
	}
	if err := s.rebuildDerived(ctx, id, rep); err != nil {
		return rep, fmt.Errorf("repair %s: %w", id, err)
	}
	if !rep.Derivable() {
		if err := s.resetLayer(ctx, id); err != nil {
			return rep, fmt.Errorf("repair %s: %w", id, err)
		}
	}
	return rep, nil
}

// lockSubtree takes the locks of id and its descendants, in the order of
// their IDs, which every Repair follows, and retries when the subtree
// changed before it held them. A descendant without a directory has no
// lock to take; nothing can mount it either.
func (s *Store) lockSubtree(ctx context.Context, id string) ([]*layerLock, error) {
	subtree := func() ([]string, error) {
		var ids []string
		err := s.view(ctx, func(st *state) error {
			if _, ok := st.Layers[id]; !ok {
				return fmt.Errorf("%s: %w", id, ErrNotExist)
			}
			ids = append(st.descendants(id), id)
			return nil
		})
		slices.Sort(ids)
		return ids, err
	}
	for attempt := 0; attempt < 10; attempt++ {
		ids, err := subtree()
		if err != nil {
			return nil, err
		}
		var locks []*layerLock
		release := func() {
			for _, l := range locks {
				l.unlock()
			}
		}
		for _, lid := range ids {
			l, err := s.lockLayer(ctx, lid)
			if errors.Is(err, ErrNotExist) && lid != id {
				continue
			}
			if err != nil {
				release()
				return nil, err
			}
			locks = append(locks, l)
		}
		now, err := subtree()
		if err != nil {
			release()
			return nil, err
		}
		if slices.Equal(ids, now) {
			return locks, nil
		}
		release()
	}
	return nil, fmt.Errorf("lock %s and its descendants: the subtree keeps changing", id)
}

// rebuildDerived makes again what the damages in rep that are derivable
// name.
func (s *Store) rebuildDerived(ctx context.Context, id string, rep Report) error {
	var link, work, record, manifest bool
	for _, d := range rep.Damage {
		if !d.Derivable {
			continue
		}
		switch d.Kind {
		case DamageLink:
			link = true
		case DamageStructure:
			work = true
		case DamageRecord:
			record = true
		case DamageManifest:
			manifest = true
		}
	}
	fsync := s.sync == SyncFsync
	if work {
		w := s.workDir(id)
		if err := os.RemoveAll(w); err != nil {
			return err
		}
		if err := os.Mkdir(w, 0o700); err != nil {
			return fmt.Errorf("make work/: %w", err)
		}
		if fsync {
			if err := syncDir(s.layerDir(id)); err != nil {
				return err
			}
		}
	}
	return s.update(ctx, func(st *state) (bool, error) {
		r := st.Layers[id]
		if r == nil {
			return false, ErrNotExist
		}
		changed := false
		if link {
			if err := s.recoverLinks(st); err != nil {
				return false, err
			}
			if fsync {
				if err := syncDir(filepath.Join(s.home, "l")); err != nil {
					return false, err
				}
			}
		}
		if record {
			for _, lid := range append(st.descendants(id), id) {
				rr := st.Layers[lid]
				if chain, err := st.chain(lid); err == nil && rr.Depth != len(chain) {
					rr.Depth, changed = len(chain), true
				}
				if len(st.children(lid)) > 0 && !rr.Committed {
					rr.Committed, changed = true, true
				}
			}
		}
		if manifest {
			if r.Applied && r.Written {
				// Its content is the container's now; what the tar
				// gave is gone with the manifest.
				r.Manifest, changed = false, true
			} else if err := writeManifest(s.layerDir(id), nil, fsync, s.log); err != nil {
				return false, err
			}
		}
		return changed, nil
	})
}

// resetLayer replaces layer id's directory by an empty one, built as
// Create builds it, and marks the record as waiting for its tar.
func (s *Store) resetLayer(ctx context.Context, id string) (err error) {
	var (
		rec       layerRecord
		parentTop string
		snapshot  *state
	)
	err = s.view(ctx, func(st *state) error {
		r, ok := st.Layers[id]
		if !ok {
			return fmt.Errorf("%s: %w", id, ErrNotExist)
		}
		rec = *r
		if rec.Written {
			return fmt.Errorf("its content was written after apply, so its tar would not give it back; remove the layer")
		}
		if kids := st.children(id); len(kids) > 0 && s.layout.name() == LayoutHardlink {
			return fmt.Errorf("in the hardlink layout its children's trees share its files; remove them first: %w: %v", ErrHasChildren, kids)
		}
		if rec.Parent != "" {
			if p := st.needsApply(rec.Parent); p != "" {
				return fmt.Errorf("ancestor %s: %w; apply it first", p, ErrNeedsApply)
			}
			parentTop = s.topDir(st, rec.Parent)
		}
		snapshot = copyChain(st, rec.Parent)
		return nil
	})
	if err != nil {
		return err
	}
	stg, err := s.newEmptyLayerStage("repair-"+id, snapshot, rec.Parent, parentTop, rec.RW)
	if err != nil {
		return err
	}
	defer func() {
		// The damaged directory lands in the stage and goes with it.
		if derr := stg.discard(); derr != nil && err == nil {
			err = derr
		}
	}()
	return s.update(ctx, func(st *state) (bool, error) {
		r, ok := st.Layers[id]
		if !ok {
			return false, fmt.Errorf("%s: %w", id, ErrNotExist)
		}
		if err := s.publish(stg, id, true); err != nil {
			return false, err
		}
		r.Applied, r.Size, r.Written = false, 0, false
		r.Manifest, r.NeedsApply = true, true
		return true, nil
	})
}
