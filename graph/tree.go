package graph

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// mkdirLike makes dir with the mode and owner of like's root ("" for 0755
// root:root). A child layer's diff root starts as a copy of its parent's
// root, because the upper's root is what the merged view shows: a plain
// 0755 directory would hide a parent's chmod of "/".
func mkdirLike(dir, like string) error {
	mode, uid, gid := os.FileMode(0o755), 0, 0
	if like != "" {
		var st unix.Stat_t
		if err := unix.Lstat(like, &st); err != nil {
			return fmt.Errorf("stat %s: %w", like, err)
		}
		mode = os.FileMode(st.Mode & 0o7777)
		uid, gid = int(st.Uid), int(st.Gid)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("mkdir %s: %w", dir, err)
	}
	if err := os.Lchown(dir, uid, gid); err != nil {
		return fmt.Errorf("chown %s: %w", dir, err)
	}
	return chmodFull(dir, mode)
}

// chmodFull sets permission and setuid/setgid/sticky bits, which
// os.Chmod's FileMode would map differently.
func chmodFull(path string, perm os.FileMode) error {
	if err := unix.Chmod(path, uint32(perm)); err != nil {
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	return nil
}

// syncTree fsyncs every file and directory below dir, directories after
// their entries, so that the rename that publishes dir cannot reach the
// disk before its content.
func syncTree(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			dirs = append(dirs, p)
		case d.Type().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			err = f.Sync()
			f.Close()
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := syncDir(dirs[i]); err != nil {
			return err
		}
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
