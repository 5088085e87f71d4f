package graph

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"

	"github.com/ovlkit/ovlkit/ovl"
)

// Status is what `ovlgraph status` shows.
type Status struct {
	Home      string       `json:"home"`
	Layout    Layout       `json:"layout"`
	Userxattr bool         `json:"userxattr"`
	BackingFS string       `json:"backing_fs"`
	Layers    int          `json:"layers"`
	Sync      SyncPolicy   `json:"sync"`
	Features  ovl.Features `json:"features"`
	// Missing names the features this kernel lacks, so a stock kernel
	// still works and says what it does without.
	Missing     []string `json:"missing,omitempty"`
	MountMethod string   `json:"mount_method"` // how a 500-layer chain is mounted
	MountOpts   []string `json:"mount_options"`
	Mounted     []Mount  `json:"mounted,omitempty"`
}

// Mount is a layer that Get references (mounted, or its diff directory
// for a layer without a parent, see Store.Get) and, where the kernel
// reports them, its copy-up statistics.
type Mount struct {
	ID       string            `json:"id"`
	Path     string            `json:"path"`
	Refs     int               `json:"refs"`
	ReadOnly bool              `json:"read_only"`
	CopyUp   map[string]uint64 `json:"copy_up,omitempty"`
}

// Status reports the store and the kernel features it uses.
func (s *Store) Status() (Status, error) {
	out := Status{Home: s.home, Layout: s.layout.name(), Userxattr: s.userx, Sync: s.sync, Features: s.feat, Missing: s.feat.Missing()}
	var err error
	if out.BackingFS, err = BackingFS(s.home); err != nil {
		return out, err
	}
	if s.feat.NewMountAPI {
		out.MountMethod = "fsconfig lowerdir+"
	} else {
		out.MountMethod = "mount(2) data, relative to l/ when longer than a page"
	}
	out.MountOpts = append(append(out.MountOpts, s.baseOptions()...), s.extraOpt...)
	var mounted []Mount
	err = s.view(context.Background(), func(st *state) error {
		out.Layers = len(st.Layers)
		for id := range st.Layers {
			m, err := s.mountsOf(id)
			if err != nil {
				return err
			}
			if m.Refs > 0 {
				mounted = append(mounted, Mount{ID: id, Path: s.rootPath(id, m), Refs: m.Refs, ReadOnly: m.ReadOnly})
			}
		}
		return nil
	})
	if err != nil {
		return out, err
	}
	sort.Slice(mounted, func(i, j int) bool { return mounted[i].ID < mounted[j].ID })
	if s.feat.CopyUpStats {
		for i := range mounted {
			c, err := ovl.CopyUpStats(mounted[i].Path)
			// A layer whose mount went away (a crashed holder, or a Put
			// since the records were read) has no counters to show.
			if errors.Is(err, ovl.ErrNotOverlay) || errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return out, fmt.Errorf("status of layer %s: %w", mounted[i].ID, err)
			}
			mounted[i].CopyUp = c
		}
	}
	out.Mounted = mounted
	return out, nil
}
