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
