package graph

import (
	"fmt"
	"strings"
)

// Layout is how layers are kept on disk, chosen when a store is created.
type Layout string

// diskLayout is what a layout decides: what shows a layer's content to
// the kernel and to the tar code, and what a layer keeps besides its diff.
// The store asks its layout instead of testing the layout's name.
type diskLayout interface {
	// name is the layout's name in Options, the state and Status.
	name() Layout
	// maxDepth is the longest chain the layout can stack, or 0 when only
	// the mount configuration limits it.
	maxDepth() int
	// ownTree reports whether layer r keeps the full tree it shows in
	// root/; such a layer is always mounted without upper.
	ownTree(r *layerRecord) bool
	// lowers returns the directories that show the content of chain (a
	// layer and its ancestors, top first), topmost first: as a mount
	// names them (forMount), or as real paths for the tar code, which
	// reports them in its errors.
	lowers(s *Store, st *state, chain []string, forMount bool) []string
	// build completes a staged layer directory ldir, which holds diff/
	// and work/, for a layer with parent (as it was in snap) that is a
	// container layer when rw; applied says diff/ holds its content.
	build(s *Store, snap *state, parent string, rw bool, ldir string, applied bool) error
}

// layouts are the layouts a store can have: a new one is a file with its
// diskLayout and its entry here.
var layouts = [...]diskLayout{overlayLayout{}, hardlinkLayout{}}

// layoutOf returns the implementation of the layout named l.
func layoutOf(l Layout) (diskLayout, error) {
	names := make([]string, len(layouts))
	for i, d := range layouts {
		if d.name() == l {
			return d, nil
		}
		names[i] = string(d.name())
	}
	return nil, fmt.Errorf("unknown layout %q (want %s)", string(l), strings.Join(names, " or "))
}

// Valid reports whether l names a layout this build knows.
func (l Layout) Valid() error {
	_, err := layoutOf(l)
	return err
}
