package graph

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// stage is a scratch directory under staging/ that its owner holds an
// flock on, so that recovery in another process leaves it alone.
type stage struct {
	dir string
	fd  int
	log *slog.Logger
}

func (s *Store) newStage(prefix string) (*stage, error) {
	// Another process opening the store removes every staging directory
	// nobody holds a lock on; one made here may go in the moment between
	// its creation and its lock. A stage is only handed out once it is
	// locked and still in place.
	for {
		dir, err := os.MkdirTemp(filepath.Join(s.home, "staging"), prefix+"-")
		if err != nil {
			return nil, fmt.Errorf("staging directory: %w", err)
		}
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			logCleanup(s.log, "remove staging directory", os.RemoveAll(dir))
			return nil, fmt.Errorf("staging directory: %w", err)
		}
		if err := flock(fd, unix.LOCK_EX); err != nil {
			unix.Close(fd)
			logCleanup(s.log, "remove staging directory", os.RemoveAll(dir))
			return nil, fmt.Errorf("lock staging directory: %w", err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("staging directory: %w", err)
		}
		if st.Nlink == 0 {
			unix.Close(fd)
			continue
		}
		return &stage{dir: dir, fd: fd, log: s.log}, nil
	}
}

// discard removes the stage and whatever it still holds.
func (st *stage) discard() error {
	err := removeAll(st.dir, st.log)
	unix.Close(st.fd)
	return err
}

// layerStage is a layer directory built in a stage: diff/ and work/, then
// the content and what the layout adds, until publish puts it in place.
type layerStage struct {
	*stage
	dir string // the layer directory inside the stage
}

// newLayerStage makes a stage holding a layer directory whose diff root
// has the mode and owner of like's (see mkdirLike). The caller discards
// the stage when done, published or not.
func (s *Store) newLayerStage(prefix, like string) (*layerStage, error) {
	stg, err := s.newStage(prefix)
	if err != nil {
		return nil, err
	}
	ls := &layerStage{stage: stg, dir: filepath.Join(stg.dir, "layer")}
	if err := ls.populate(like); err != nil {
		logCleanup(s.log, "discard stage", stg.discard())
		return nil, err
	}
	return ls, nil
}

func (ls *layerStage) populate(like string) error {
	if err := os.Mkdir(ls.dir, ownerOnly); err != nil {
		return err
	}
	if err := mkdirLike(ls.diff(), like); err != nil {
		return err
	}
	return os.Mkdir(filepath.Join(ls.dir, "work"), 0o700)
}

// newEmptyLayerStage stages an empty layer as Create makes it: on top of
// parent, whose chain is in chain and whose top directory is parentTop
// ("" for a base layer), with an empty manifest, synced under the fsync
// policy. It replaces a layer's directory whose content must go (a
// repair, or an apply recovery undoes) when published with exchange.
func (s *Store) newEmptyLayerStage(prefix string, chain *state, parent, parentTop string, rw bool) (*layerStage, error) {
	stg, err := s.newLayerStage(prefix, parentTop)
	if err != nil {
		return nil, err
	}
	if err := stg.fillEmpty(s, chain, parent, rw); err != nil {
		logCleanup(s.log, "discard stage", stg.discard())
		return nil, err
	}
	return stg, nil
}

func (ls *layerStage) fillEmpty(s *Store, chain *state, parent string, rw bool) error {
	if err := s.layout.build(s, chain, parent, rw, ls.dir, false); err != nil {
		return err
	}
	if err := writeManifest(ls.dir, nil, false, s.log); err != nil {
		return err
	}
	if s.sync == SyncFsync {
		return syncTree(ls.dir)
	}
	return nil
}

// diff is the staged layer's diff directory.
func (ls *layerStage) diff() string { return filepath.Join(ls.dir, "diff") }

// publish puts the staged layer directory at layers/<id> in one rename:
// an atomic exchange with the directory there when exchange is set (its
// old content lands in the stage and goes with it), a plain rename
// otherwise. With the fsync policy layers/ is synced, so that the rename
// is durable before the state records it.
func (s *Store) publish(ls *layerStage, id string, exchange bool) error {
	var err error
	if exchange {
		err = unix.Renameat2(unix.AT_FDCWD, ls.dir, unix.AT_FDCWD, s.layerDir(id), unix.RENAME_EXCHANGE)
	} else {
		err = os.Rename(ls.dir, s.layerDir(id))
	}
	if err != nil {
		return fmt.Errorf("publish layer: %w", err)
	}
	if s.sync == SyncFsync {
		return syncDir(filepath.Join(s.home, "layers"))
	}
	return nil
}

// syncStage makes everything written below a stage durable with one
// syncfs(2) of the filesystem that holds it, instead of an fsync of every
// file and directory. The layer is published afterwards by a rename (and
// recorded by an fdatasync'd append to the state log), so after a crash
// either the layer is not there or it is there with all it holds: syncfs
// returns once every dirty page and inode of the filesystem is on disk
// and, on ext4 and xfs, the journal committed with a cache flush, the
// stage's files and directories among them, which is what the fsyncs of
// each file and directory guaranteed before the same rename.
//
// Errors: since Linux 5.8 syncfs reports a writeback error of the
// filesystem that happened since the descriptor was opened; the stage's
// descriptor is opened before anything is written into it, so a lost
// write of the layer fails the apply as a failed fsync did.
//
// Cost: syncfs flushes the other dirty data of the filesystem too (the
// writes of running containers whose upper shares it), and waits for it.
// On a layer of many small files that is still far less than an fsync,
// and so a journal commit, per file.
func syncStage(st *stage) error {
	if err := unix.Syncfs(st.fd); err != nil {
		return fmt.Errorf("syncfs %s: %w", st.dir, err)
	}
	return nil
}
