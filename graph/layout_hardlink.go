package graph

import (
	"path/filepath"

	"github.com/ovlkit/ovlkit/layer"
)

// LayoutHardlink is the 2014 design: an image layer is a full tree (root/)
// made by hard-linking its parent's tree and merging its diff into it, and
// a container layer is an overlay on that single tree.
const LayoutHardlink Layout = "hardlink"

type hardlinkLayout struct{}

func (hardlinkLayout) name() Layout { return LayoutHardlink }

// maxDepth: only container layers above the nearest image layer stack.
func (hardlinkLayout) maxDepth() int { return 0 }

func (hardlinkLayout) ownTree(r *layerRecord) bool { return !r.RW }

// lowers are the diffs of the container layers down to the nearest image
// layer's full tree, the same for a mount and for the tar code.
func (hardlinkLayout) lowers(s *Store, st *state, chain []string, _ bool) []string {
	var out []string
	for _, id := range chain {
		if !st.Layers[id].RW {
			return append(out, s.rootDir(id))
		}
		out = append(out, s.diffDir(id))
	}
	return out
}

// build makes an image layer's full tree: its parent's view, with the
// layer's diff merged in once it has content.
func (hardlinkLayout) build(s *Store, snap *state, parent string, rw bool, ldir string, applied bool) error {
	if rw {
		return nil
	}
	root := filepath.Join(ldir, "root")
	if err := s.buildView(snap, parent, root); err != nil {
		return err
	}
	if applied {
		return layer.MergeDiff(filepath.Join(ldir, "diff"), root)
	}
	return nil
}

// buildView writes, at dst, the full tree that layer id shows: the
// nearest image ancestor's tree hard-linked, then the diffs of the
// container layers above it merged in order. id "" gives an empty 0755
// directory.
func (s *Store) buildView(st *state, id, dst string) error {
	if id == "" {
		return mkdirLike(dst, "")
	}
	chain, err := st.chain(id)
	if err != nil {
		return err
	}
	var diffs []string
	base := ""
	for _, cid := range chain {
		if !st.Layers[cid].RW {
			base = s.rootDir(cid)
			break
		}
		diffs = append(diffs, s.diffDir(cid))
	}
	if base == "" {
		if err := mkdirLike(dst, ""); err != nil {
			return err
		}
	} else if err := layer.LinkTree(base, dst); err != nil {
		return err
	}
	for i := len(diffs) - 1; i >= 0; i-- {
		if err := layer.MergeDiff(diffs[i], dst); err != nil {
			return err
		}
	}
	return nil
}
