package graph

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/ovlkit/ovlkit/ovl"
	"golang.org/x/sys/unix"
)

// MountSpec is a layer's mount for a caller that mounts it itself, in the
// shape of mount(8) and of containerd's mount.Mount: a type, a source and
// one option per element.
type MountSpec struct {
	Type   string `json:"type"`   // "overlay"
	Source string `json:"source"` // "overlay"
	// Options: lowerdir= (topmost first, joined with ':'), upperdir= and
	// workdir= for a writable mount, the store's options, then "ro",
	// "nosuid" and "nodev" for a read-only one. Paths are absolute; the
	// lowers are the short links under l/, which share one directory,
	// so a caller over the page limit can make them relative to it.
	Options []string `json:"options"`
	// ReadOnly: the spec has no upper.
	ReadOnly bool `json:"read_only"`
}

func specOf(cfg ovl.Config, ro bool) MountSpec {
	return MountSpec{Type: "overlay", Source: "overlay", Options: cfg.OptionList(ro), ReadOnly: ro}
}

// MountSpec returns how Get would mount id, without mounting it and
// without recording anything: for a look at the configuration. A caller
// that mounts from it uses Acquire, which accounts for the mount.
func (s *Store) MountSpec(ctx context.Context, id string) (MountSpec, error) {
	var spec MountSpec
	err := s.view(ctx, func(st *state) error {
		if _, ok := st.Layers[id]; !ok {
			return fmt.Errorf("mount spec %s: %w", id, ErrNotExist)
		}
		cfg, ro, err := s.mountConfig(st, id)
		if err != nil {
			return fmt.Errorf("mount spec %s: %w", id, err)
		}
		spec = specOf(cfg, ro)
		return nil
	})
	return spec, err
}

// Acquire returns the spec of id's mount as Get would make it (writable
// for a container layer that is not committed) and records the hold of
// holder, a name the caller chooses: until Release, Remove, Commit,
// ApplyDiff and Repair refuse the layer with ErrMounted and Get refuses
// to mount it writable, just as for a mount of Get's. Acquire does for the
// caller's mount what Get does for its own: a writable hold of an applied
// layer marks it written (Verify and Check then judge only its
// structure), and with Options.Volatile the spec carries "volatile" and
// the layer is refused after a reboot (ErrVolatileLost).
//
// Acquiring again under the same holder returns the spec again and
// changes nothing; a second writable holder is refused.
func (s *Store) Acquire(ctx context.Context, id, holder string) (MountSpec, error) {
	return s.hold(ctx, "acquire", id, holder, false)
}

// View returns a read-only spec of id's content and records a read-only
// hold of holder, for a caller that reads a layer without making a layer
// of its own: the mount has id's diff and its ancestors' as lowers and no
// upper, so a view costs no depth and a view of a 500-layer chain mounts.
// It is refused (ErrMounted) while id is mounted or held writable. Release
// ends it.
func (s *Store) View(ctx context.Context, id, holder string) (MountSpec, error) {
	return s.hold(ctx, "view", id, holder, true)
}

func (s *Store) hold(ctx context.Context, op, id, holder string, view bool) (MountSpec, error) {
	if holder == "" {
		return MountSpec{}, fmt.Errorf("%s %s: empty holder name", op, id)
	}
	l, m, live, err := s.lockMounts(ctx, op, id)
	if err != nil {
		return MountSpec{}, err
	}
	defer l.unlock()
	var spec MountSpec
	err = s.update(ctx, func(st *state) (bool, error) {
		r, ok := st.Layers[id]
		if !ok {
			return false, fmt.Errorf("%s %s: %w", op, id, ErrNotExist)
		}
		if p := st.needsApply(id); p != "" {
			return false, fmt.Errorf("%s %s: %s: %w", op, id, p, ErrNeedsApply)
		}
		var (
			cfg ovl.Config
			ro  bool
		)
		if view {
			cfg, ro, err = s.viewConfig(st, id)
		} else {
			cfg, ro, err = s.mountConfig(st, id)
		}
		if err != nil {
			return false, fmt.Errorf("%s %s: %w", op, id, err)
		}
		if live && !m.ReadOnly {
			return false, fmt.Errorf("%s %s: mounted writable by Get: %w", op, id, ErrMounted)
		}
		if h := r.rwHolder(holder); h != "" {
			return false, fmt.Errorf("%s %s: held writable by %s: %w", op, id, h, ErrMounted)
		}
		if !ro {
			if live {
				return false, fmt.Errorf("%s %s: mounted by Get: %w", op, id, ErrMounted)
			}
			for _, h := range sortedHolders(r.Holds) {
				if h != holder {
					return false, fmt.Errorf("%s %s: held by %s: %w", op, id, h, ErrMounted)
				}
			}
		}
		spec = specOf(cfg, ro)
		if prev, had := r.Holds[holder]; had && prev.RW == !ro {
			return false, nil
		}
		if !ro && s.volatile {
			if err := s.prepareVolatile(l); err != nil {
				return false, fmt.Errorf("%s: %w", op, err)
			}
		}
		if r.Holds == nil {
			r.Holds = map[string]Hold{}
		}
		r.Holds[holder] = Hold{RW: !ro, Since: time.Now().UTC()}
		if !ro && r.Applied {
			r.Written = true
		}
		return true, nil
	})
	return spec, err
}

// viewConfig is a read-only mount of id's content: its own diff and its
// ancestors' as lowers (and empty/ below a single one, since overlayfs
// needs two lowers without an upper), mounted nosuid,nodev like every
// view without upper.
func (s *Store) viewConfig(st *state, id string) (ovl.Config, bool, error) {
	cfg := ovl.Config{Base: filepath.Join(s.home, "l"), Options: s.readOnlyOptions(), NoSuid: true, NoDev: true}
	lowers, err := s.lowersOf(st, id)
	if err != nil {
		return cfg, true, err
	}
	if len(lowers) == 1 {
		lowers = append(lowers, s.emptyDir())
	}
	cfg.Lower = lowers
	if err := cfg.Validate(); err != nil {
		return cfg, true, fmt.Errorf("%w: %w", err, ErrTooDeep)
	}
	return cfg, true, nil
}

// Release ends the hold of holder on id. A holder that holds nothing
// gets ErrNotMounted.
func (s *Store) Release(ctx context.Context, id, holder string) error {
	return s.update(ctx, func(st *state) (bool, error) {
		r, ok := st.Layers[id]
		if !ok {
			return false, fmt.Errorf("release %s: %w", id, ErrNotExist)
		}
		if _, ok := r.Holds[holder]; !ok {
			return false, fmt.Errorf("release %s: no hold of %q: %w", id, holder, ErrNotMounted)
		}
		delete(r.Holds, holder)
		if len(r.Holds) == 0 {
			r.Holds = nil
		}
		return true, nil
	})
}

// Commit freezes id: from now on it is mounted read-only (Get, Acquire)
// and can take children, as a layer does once it has a child. It is
// refused while the layer is mounted or held writable. Committing a
// committed layer changes nothing.
func (s *Store) Commit(ctx context.Context, id string) error {
	l, m, live, err := s.lockMounts(ctx, "commit", id)
	if err != nil {
		return err
	}
	defer l.unlock()
	if live && !m.ReadOnly {
		return fmt.Errorf("commit %s: mounted writable (%d references): %w", id, m.Refs, ErrMounted)
	}
	return s.update(ctx, func(st *state) (bool, error) {
		r, ok := st.Layers[id]
		if !ok {
			return false, fmt.Errorf("commit %s: %w", id, ErrNotExist)
		}
		if h := r.rwHolder(""); h != "" {
			return false, fmt.Errorf("commit %s: held writable by %s: %w", id, h, ErrMounted)
		}
		if r.Committed {
			return false, nil
		}
		r.Committed = true
		if _, _, err := s.mountConfig(st, id); err != nil {
			return false, fmt.Errorf("commit %s: %w", id, err)
		}
		return true, nil
	})
}

// Usage is what a layer's own changes take on disk.
type Usage struct {
	// Bytes: the blocks allocated to its files and directories, in
	// bytes (st_blocks × 512), each inode counted once.
	Bytes int64 `json:"bytes"`
	// Inodes: its files and directories, the diff's root included, hard
	// links counted once.
	Inodes int64 `json:"inodes"`
}

// DiskUsage measures id's own changes (its diff) in blocks and inodes, as
// containerd's snapshotters and du(1) count them; DiffSize counts the
// apparent bytes of regular files instead.
func (s *Store) DiskUsage(ctx context.Context, id string) (Usage, error) {
	if err := s.view(ctx, func(st *state) error {
		if _, ok := st.Layers[id]; !ok {
			return fmt.Errorf("usage %s: %w", id, ErrNotExist)
		}
		return nil
	}); err != nil {
		return Usage{}, err
	}
	u, err := diskUsage(s.diffDir(id))
	if err != nil {
		return u, fmt.Errorf("usage %s: %w", id, err)
	}
	return u, nil
}

func diskUsage(dir string) (Usage, error) {
	var u Usage
	type ino struct{ dev, ino uint64 }
	seen := map[ino]bool{}
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		k := ino{uint64(st.Dev), st.Ino}
		if seen[k] {
			return nil
		}
		seen[k] = true
		u.Inodes++
		u.Bytes += st.Blocks * 512
		return nil
	})
	return u, err
}

// chownRoots gives the roots of a staged layer directory (diff/, and
// root/ where the layout keeps a tree) to o.
func chownRoots(ldir string, o Owner) error {
	for _, d := range []string{"diff", "root"} {
		p := filepath.Join(ldir, d)
		err := os.Lchown(p, o.UID, o.GID)
		if errors.Is(err, fs.ErrNotExist) && d == "root" {
			continue
		}
		if err != nil {
			return fmt.Errorf("chown %s: %w", p, err)
		}
	}
	return nil
}
