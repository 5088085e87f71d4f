package graph

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ovlkit/ovlkit/ovl"
	"golang.org/x/sys/unix"
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

// Mount is a mounted layer and, where the kernel reports them, its
// copy-up statistics.
type Mount struct {
	ID       string            `json:"id"`
	Path     string            `json:"path"`
	Refs     int               `json:"refs"`
	ReadOnly bool              `json:"read_only"`
	CopyUp   map[string]uint64 `json:"copy_up,omitempty"`
}

var fsNames = map[int64]string{
	0xEF53:     "ext4",
	0x58465342: "xfs",
	0x9123683E: "btrfs",
	0x01021994: "tmpfs",
	0x794c7630: "overlay",
	0x858458f6: "ramfs",
	0x6969:     "nfs",
	0x4d44:     "vfat",
	0x2011bab0: "exfat",
	0x65735546: "fuse",
	0xf15f:     "ecryptfs",
	0x2fc12fc1: "zfs",
	0xf2f52010: "f2fs",
}

// BackingFS names the filesystem of dir.
func BackingFS(dir string) (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "", fmt.Errorf("statfs %s: %w", dir, err)
	}
	if n, ok := fsNames[int64(st.Type)]; ok {
		return n, nil
	}
	return fmt.Sprintf("0x%x", st.Type), nil
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
	out.MountOpts = append(append(out.MountOpts, s.feat.BaseOptions()...), s.extraOpt...)
	var mounted []Mount
	err = s.view(func(st *state) error {
		out.Layers = len(st.Layers)
		for id := range st.Layers {
			m, err := s.mountsOf(id)
			if err != nil {
				return err
			}
			if m.Refs > 0 {
				mounted = append(mounted, Mount{ID: id, Path: s.mergedDir(id), Refs: m.Refs, ReadOnly: m.ReadOnly})
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

// Problem is one broken invariant found by Check.
type Problem struct {
	Layer string `json:"layer,omitempty"`
	What  string `json:"what"`
}

func (p Problem) String() string {
	if p.Layer == "" {
		return p.What
	}
	return p.Layer + ": " + p.What
}

// Check verifies the store's invariants without changing anything: every
// recorded layer has its directories, parent and link; depths add up;
// mount counts agree with the kernel; no directory lacks a record; the
// recorded size of applied layers matches their content.
func (s *Store) Check() ([]Problem, error) {
	var probs []Problem
	add := func(id, f string, a ...any) { probs = append(probs, Problem{id, fmt.Sprintf(f, a...)}) }
	err := s.view(func(st *state) error {
		links := map[string]string{}
		for id, r := range st.Layers {
			if other, dup := links[r.Link]; dup {
				add(id, "link %s also used by %s", r.Link, other)
			}
			links[r.Link] = id
			if !validLink(r.Link) {
				add(id, "invalid link name %q", r.Link)
			}
			dirs := []string{s.diffDir(id), s.workDir(id)}
			if s.layout.ownTree(r) {
				dirs = append(dirs, s.rootDir(id))
			}
			for _, d := range dirs {
				if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
					add(id, "missing directory %s", d)
				}
			}
			want := filepath.Join("..", "layers", id, "diff")
			if got, err := os.Readlink(s.linkPath(r.Link)); err != nil || got != want {
				add(id, "link l/%s does not point to %s", r.Link, want)
			}
			if r.Parent != "" {
				p, ok := st.Layers[r.Parent]
				if !ok {
					add(id, "parent %s does not exist", r.Parent)
				} else {
					if p.Depth+1 != r.Depth {
						add(id, "depth %d, parent depth %d", r.Depth, p.Depth)
					}
					if !p.Committed {
						add(id, "parent %s is not marked committed", r.Parent)
					}
				}
			} else if r.Depth != 1 {
				add(id, "depth %d without parent", r.Depth)
			}
			if _, err := st.chain(id); err != nil {
				add(id, "%v", err)
			}
			if err := s.checkMounts(id); err != nil {
				add(id, "%v", err)
			}
			if r.Applied && !r.Written {
				if n, err := layerSize(s.diffDir(id)); err != nil {
					add(id, "size: %v", err)
				} else if n != r.Size {
					add(id, "content is %d bytes, %d recorded", n, r.Size)
				}
			}
		}
		if ents, err := os.ReadDir(filepath.Join(s.home, "layers")); err == nil {
			for _, e := range ents {
				if _, ok := st.Layers[e.Name()]; !ok {
					add("", "layers/%s has no record", e.Name())
				}
			}
		}
		if ents, err := os.ReadDir(filepath.Join(s.home, "l")); err == nil {
			for _, e := range ents {
				if _, ok := links[e.Name()]; !ok {
					add("", "l/%s belongs to no layer", e.Name())
				}
			}
		}
		if ents, err := os.ReadDir(s.emptyDir()); err != nil || len(ents) > 0 {
			add("", "empty/ is missing or not empty")
		}
		return nil
	})
	sort.Slice(probs, func(i, j int) bool { return probs[i].String() < probs[j].String() })
	return probs, err
}

// Summary is one line per problem, for messages.
func Summary(probs []Problem) string {
	var b strings.Builder
	for _, p := range probs {
		b.WriteString(p.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// checkMounts compares id's mount record with the kernel's mount table.
func (s *Store) checkMounts(id string) error {
	m, err := s.recordedMounts(id)
	if err != nil {
		return err
	}
	if mounted := isMounted(s.mergedDir(id)); mounted != (m.Refs > 0) {
		return fmt.Errorf("mount count %d but mounted=%v", m.Refs, mounted)
	}
	return nil
}
