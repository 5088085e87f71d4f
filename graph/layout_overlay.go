package graph

import "github.com/ovlkit/ovlkit/ovl"

// LayoutOverlay keeps only each layer's own diff and stacks all its
// ancestors' diffs as lower layers, named by their short links under l/.
const LayoutOverlay Layout = "overlay"

type overlayLayout struct{}

func (overlayLayout) name() Layout { return LayoutOverlay }

// maxDepth: every ancestor is a lower layer of the mount.
func (overlayLayout) maxDepth() int { return ovl.MaxLowers }

func (overlayLayout) ownTree(*layerRecord) bool { return false }

func (overlayLayout) lowers(s *Store, st *state, chain []string, forMount bool) []string {
	out := make([]string, len(chain))
	for i, id := range chain {
		if forMount {
			out[i] = s.linkPath(st.Layers[id].Link)
		} else {
			out[i] = s.diffDir(id)
		}
	}
	return out
}

// build: a layer is its diff alone.
func (overlayLayout) build(*Store, *state, string, bool, string, bool) error { return nil }
