package graph

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/ovlkit/ovlkit/layer"
)

// Differ is the part of the store that moves layers in and out as tar.
type Differ interface {
	ApplyDiff(ctx context.Context, id string, r io.Reader) (int64, error)
	Diff(ctx context.Context, id string, w io.Writer) error
	Changes(ctx context.Context, id string) ([]layer.Change, error)
	DiffSize(id string) (int64, error)
}

// ApplyDiff fills the empty layer id from a tar layer (plain, gzip or
// zstd) and returns the content size written. The layer is built in a
// staging directory, flushed according to the sync policy, and swapped in
// with one rename; a failed or interrupted apply leaves the layer as it
// was.
func (s *Store) ApplyDiff(ctx context.Context, id string, r io.Reader) (n int64, err error) {
	l, _, live, err := s.lockMounts(ctx, "apply", id)
	if err != nil {
		return 0, err
	}
	defer l.unlock()
	if live {
		return 0, fmt.Errorf("apply %s: %w", id, ErrMounted)
	}
	tgt, err := s.applyTarget(ctx, id)
	if err != nil {
		return 0, err
	}
	stg, err := s.newLayerStage("apply-"+id, s.diffDir(id))
	if err != nil {
		return 0, fmt.Errorf("apply %s: %w", id, err)
	}
	defer func() {
		if derr := stg.discard(); derr != nil && err == nil {
			err = fmt.Errorf("apply %s: %w", id, derr)
		}
	}()
	if n, err = s.buildApplied(ctx, stg, r, tgt); err != nil {
		return 0, fmt.Errorf("apply %s: %w", id, err)
	}
	err = s.update(ctx, func(st *state) (bool, error) {
		rec, err := s.checkApply(st, id)
		if err != nil {
			return false, err
		}
		// The old, empty layer directory lands in the stage.
		if err := s.publish(stg, id, true); err != nil {
			return false, fmt.Errorf("apply %s: %w", id, err)
		}
		rec.Applied, rec.Size = true, n
		rec.Manifest, rec.NeedsApply = true, false
		return true, nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// applyInput is what ApplyDiff reads of the state before it builds.
type applyInput struct {
	lowers   []string // the parent's content, for the tar code
	parent   string
	rw       bool
	snapshot *state // the parent's chain as it was when staging began
}

// applyTarget checks that id may be filled and reads what filling it
// needs.
func (s *Store) applyTarget(ctx context.Context, id string) (applyInput, error) {
	var in applyInput
	err := s.view(ctx, func(st *state) error {
		rec, err := s.checkApply(st, id)
		if err != nil {
			return err
		}
		in.parent, in.rw = rec.Parent, rec.RW
		if in.lowers, err = s.realLowersOf(st, in.parent); err != nil {
			return err
		}
		in.snapshot = copyChain(st, in.parent)
		return nil
	})
	return in, err
}

// checkApply returns id's record if ApplyDiff may fill it: it exists, has
// no content yet, and has no children, unless Repair reset it for its tar
// to be applied again under them (none of them can be mounted then).
func (s *Store) checkApply(st *state, id string) (*layerRecord, error) {
	rec, ok := st.Layers[id]
	if !ok {
		return nil, fmt.Errorf("apply %s: %w", id, ErrNotExist)
	}
	if kids := st.children(id); len(kids) > 0 && !rec.NeedsApply {
		return nil, fmt.Errorf("apply %s: %w: %v", id, ErrHasChildren, kids)
	}
	if rec.Parent != "" {
		if p := st.needsApply(rec.Parent); p != "" {
			return nil, fmt.Errorf("apply %s: ancestor %s: %w; apply it first", id, p, ErrNeedsApply)
		}
	}
	for _, d := range st.descendants(id) {
		if m, err := s.mountsOf(d); err != nil || m.Refs > 0 {
			return nil, fmt.Errorf("apply %s: descendant %s is mounted: %w", id, d, ErrMounted)
		}
	}
	for _, d := range append([]string{id}, st.descendants(id)...) {
		if h := st.Layers[d].Holds; len(h) > 0 {
			return nil, fmt.Errorf("apply %s: %s is held by %v: %w", id, d, sortedHolders(h), ErrMounted)
		}
	}
	empty, err := dirEmpty(s.diffDir(id))
	if err != nil {
		return nil, fmt.Errorf("apply %s: %w", id, err)
	}
	if rec.Applied || !empty {
		return nil, fmt.Errorf("apply %s: %w", id, ErrNotEmpty)
	}
	return rec, nil
}

// buildApplied fills the staged layer from the tar r, adds what the
// layout keeps besides the diff, and makes the stage durable according to
// the sync policy; it returns the content size.
func (s *Store) buildApplied(ctx context.Context, stg *layerStage, r io.Reader, in applyInput) (int64, error) {
	// No fsync per file: one syncfs below, before the layer is published,
	// makes the whole stage durable at once, manifest included.
	digests := map[inodeID]layer.FileDigest{}
	n, err := layer.Apply(ctx, stg.diff(), r, layer.ApplyOptions{
		Whiteouts: s.whiteouts(),
		Lowers:    nonNil(in.lowers),
		Limits:    s.limits,
		Digest:    func(d layer.FileDigest) { digests[inodeID{dev: d.Dev, ino: d.Ino}] = d },
	})
	if err != nil {
		return 0, err
	}
	entries, err := buildManifest(ctx, stg.diff(), digests)
	if err != nil {
		return 0, err
	}
	if err := writeManifest(stg.dir, entries, false, s.log); err != nil {
		return 0, err
	}
	if err := s.layout.build(s, in.snapshot, in.parent, in.rw, stg.dir, true); err != nil {
		return 0, err
	}
	if s.sync == SyncFsync {
		if err := syncStage(stg.stage); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// nonNil turns "no lowers" into an empty list: the tar code reads nil as
// "lowers unknown" and keeps every opaque marker.
func nonNil(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}

func dirEmpty(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return false, err
}

// diffInputs returns the layer's diff directory and its lowers.
func (s *Store) diffInputs(ctx context.Context, id string) (string, []string, error) {
	var (
		lowers []string
		diff   string
	)
	// No store lock when the state is unchanged: the export that follows
	// reads the directories without it anyway.
	err := s.peek(ctx, func(st *state) error {
		rec, ok := st.Layers[id]
		if !ok {
			return fmt.Errorf("%s: %w", id, ErrNotExist)
		}
		if p := st.needsApply(id); p != "" {
			return fmt.Errorf("%s: %s: %w", id, p, ErrNeedsApply)
		}
		l, err := s.realLowersOf(st, rec.Parent)
		if err != nil {
			return err
		}
		lowers, diff = nonNil(l), s.diffDir(id)
		return nil
	})
	return diff, lowers, err
}

// Diff writes the layer's changes against its parent as an OCI tar layer.
// It reads only the layer's own directory (and looks up below it where a
// whiteout, an opaque directory, a redirect or a metacopy file needs it).
func (s *Store) Diff(ctx context.Context, id string, w io.Writer) error {
	diff, lowers, err := s.diffInputs(ctx, id)
	if err != nil {
		return fmt.Errorf("diff: %w", err)
	}
	if err := layer.Export(ctx, w, diff, layer.ExportOptions{Whiteouts: s.whiteouts(), Lowers: lowers}); err != nil {
		return fmt.Errorf("diff %s: %w", id, err)
	}
	return nil
}

// Changes lists the paths the layer adds, modifies and deletes.
func (s *Store) Changes(ctx context.Context, id string) ([]layer.Change, error) {
	diff, lowers, err := s.diffInputs(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("changes: %w", err)
	}
	ch, err := layer.Changes(ctx, diff, lowers, layer.ExportOptions{Whiteouts: s.whiteouts(), Lowers: lowers})
	if err != nil {
		return nil, fmt.Errorf("changes %s: %w", id, err)
	}
	return ch, nil
}

// DiffSize is the content size of the layer's own changes.
func (s *Store) DiffSize(id string) (int64, error) {
	diff, _, err := s.diffInputs(context.Background(), id)
	if err != nil {
		return 0, fmt.Errorf("diff size: %w", err)
	}
	n, err := layer.Size(diff)
	if err != nil {
		return 0, fmt.Errorf("diff size %s: %w", id, err)
	}
	return n, nil
}

func layerSize(diff string) (int64, error) { return layer.Size(diff) }
