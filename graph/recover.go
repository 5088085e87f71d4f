package graph

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/ovlkit/ovlkit/ovl"
	"golang.org/x/sys/unix"
)

// removeAll removes a tree that may hold leftover mounts (a crashed Get
// leaves merged/ mounted): those are detached first.
// A failed detach is logged; the removal's own error says what stayed.
func removeAll(dir string, log *slog.Logger) error {
	err := os.RemoveAll(dir)
	if err == nil {
		return nil
	}
	if mps, merr := ovl.MountsBeneath(dir); merr == nil && len(mps) > 0 {
		for _, mp := range mps {
			logCleanup(log, "detach leftover mount", unix.Unmount(mp, unix.MNT_DETACH))
		}
		err = os.RemoveAll(dir)
	}
	if err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// recover brings the directories in line with the state; the caller holds
// the store lock.
func (s *Store) recover(st *state) error {
	steps := []func(*state) error{
		s.recoverStaging, s.recoverLayerDirs, s.recoverUnrecordedApply, s.recoverLinks, s.recoverLeftovers,
		s.recoverMountCounts,
	}
	for _, step := range steps {
		if err := step(st); err != nil {
			return fmt.Errorf("recover: %w", err)
		}
	}
	return nil
}

// recoverStaging removes the staging directories nobody holds: they are
// interrupted operations.
func (s *Store) recoverStaging(*state) error {
	ents, err := os.ReadDir(filepath.Join(s.home, "staging"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := filepath.Join(s.home, "staging", e.Name())
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			logCleanup(s.log, "remove leftover stage", removeAll(p, s.log))
			continue
		}
		if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil {
			logCleanup(s.log, "remove leftover stage", removeAll(p, s.log))
		}
		unix.Close(fd)
	}
	return nil
}

// recoverLayerDirs removes layer directories without a record: a Create
// that crashed after its rename but before the state recorded it, or a
// Remove that crashed after the state dropped the layer.
func (s *Store) recoverLayerDirs(st *state) error {
	ents, err := os.ReadDir(filepath.Join(s.home, "layers"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := filepath.Join(s.home, "layers", e.Name())
		if _, ok := st.Layers[e.Name()]; !ok {
			if err := removeAll(p, s.log); err != nil {
				return err
			}
			continue
		}
		// A layer directory holds the diff and the mount point: the
		// owner's only (see ownerOnly), also in a store from before.
		if err := restrictDir(p); err != nil {
			return err
		}
	}
	return nil
}

// recoverUnrecordedApply undoes an ApplyDiff that a crash cut after the
// exchange that put its content in place (made durable by the fsync of
// layers/) and before the state record that makes the layer applied: the
// record says empty, while the layer directory holds the content and its
// manifest. The apply never returned, so the layer goes back to how it
// was, empty, as its record says; left as it is, Verify reports it
// damaged and a second ApplyDiff refuses its non-empty diff. The
// manifest tells it from a container layer's own writes: Create and
// Repair give a layer an empty one, only an apply a filled one. No other
// process can be inside an apply's publication: it happens under the
// store lock, which recovery holds.
func (s *Store) recoverUnrecordedApply(st *state) error {
	for id, r := range st.Layers {
		if r.Applied || !r.Manifest {
			continue
		}
		m, err := readManifest(s.layerDir(id))
		if err != nil || len(m) == 0 {
			// A manifest that does not read is Verify's to report.
			continue
		}
		if err := s.emptyLayer(st, id, r); err != nil {
			return fmt.Errorf("layer %s, applied without its record: %w", id, err)
		}
	}
	return nil
}

// emptyLayer replaces the directory of id by an empty one, as Create
// makes it, with one exchange; the record stays as it is.
func (s *Store) emptyLayer(st *state, id string, r *layerRecord) (err error) {
	like := ""
	if r.Parent != "" {
		like = s.topDir(st, r.Parent)
	}
	stg, err := s.newEmptyLayerStage("unapply-"+id, copyChain(st, r.Parent), r.Parent, like, r.RW)
	if err != nil {
		return err
	}
	defer func() {
		// The applied directory lands in the stage and goes with it.
		if derr := stg.discard(); derr != nil && err == nil {
			err = derr
		}
	}()
	return s.publish(stg, id, true)
}

// recoverLinks keeps l/ a directory of links (podman #24900 saw it become
// a symlink after a crash): lost links are made again, strays dropped.
func (s *Store) recoverLinks(st *state) error {
	ldir := filepath.Join(s.home, "l")
	if fi, err := os.Lstat(ldir); err != nil || !fi.IsDir() {
		// A failure shows in the Mkdir below.
		logCleanup(s.log, "replace l/", os.RemoveAll(ldir))
		if err := os.Mkdir(ldir, ownerOnly); err != nil {
			return fmt.Errorf("l/: %w", err)
		}
	}
	if err := restrictDir(ldir); err != nil {
		return err
	}
	want := map[string]string{}
	for id, r := range st.Layers {
		want[r.Link] = filepath.Join("..", "layers", id, "diff")
	}
	ents, err := os.ReadDir(ldir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if _, ok := want[e.Name()]; !ok {
			logCleanup(s.log, "remove stray link", os.RemoveAll(filepath.Join(ldir, e.Name())))
		}
	}
	for link, target := range want {
		if err := ensureLink(filepath.Join(ldir, link), target); err != nil {
			return err
		}
	}
	return nil
}

// recoverLeftovers empties empty/, the lower of every parentless layer,
// and removes the new file of a state compaction that crashed before its
// rename (compactions run under the store lock, which is held here).
func (s *Store) recoverLeftovers(*state) error {
	if ents, err := os.ReadDir(s.emptyDir()); err == nil && len(ents) > 0 {
		for _, e := range ents {
			logCleanup(s.log, "empty empty/", os.RemoveAll(filepath.Join(s.emptyDir(), e.Name())))
		}
	}
	if tmps, err := filepath.Glob(filepath.Join(s.home, ".state-*")); err == nil {
		for _, p := range tmps {
			logCleanup(s.log, "remove unfinished state file", os.Remove(p))
		}
	}
	return nil
}

// recoverMountCounts clears the mount counts of a crashed process. A
// layer whose lock is held is in use by a live process, which checks the
// count itself.
func (s *Store) recoverMountCounts(st *state) error {
	for id := range st.Layers {
		l, err := s.lockLayerHow(context.Background(), id, unix.LOCK_EX|unix.LOCK_NB)
		if err != nil {
			continue
		}
		if m, live, err := l.liveMounts(); err != nil || (m.Refs > 0 && !live) {
			logCleanup(s.log, "clear stale mount count", l.setMounts(mountRecord{}))
		}
		l.unlock()
	}
	return nil
}

// ensureLink makes path a symlink to target, replacing anything else.
func ensureLink(path, target string) error {
	if cur, err := os.Readlink(path); err == nil && cur == target {
		return nil
	}
	if err := os.RemoveAll(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("replace link %s: %w", path, err)
	}
	if err := os.Symlink(target, path); err != nil {
		return fmt.Errorf("link %s: %w", path, err)
	}
	return nil
}
