package graph

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ownerOnly is the mode of the home and of every directory the store
// keeps in it (layers/, l/, empty/, staging/ and each layer's directory):
// only the owner, root, may search them. The diffs hold what images
// ship (setuid-root programs, device nodes, world-writable roots), and a
// mount point shows them: a host user who could reach either would run
// those programs with their privilege, open those devices or write into
// layers that other containers share (the class of moby CVE-2021-41091
// and containerd CVE-2021-41103). Mounts need no search permission on
// these directories: the kernel resolves the layers once, as the
// mounter, and a container gets its root from the runtime, not by path.
const ownerOnly = 0o700

// restrictDir gives dir the mode ownerOnly unless it has it already: a
// store made before the modes tightened is locked down by its next Open.
// The error names the directory.
func restrictDir(dir string) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("restrict %s to its owner: %w", dir, err)
	}
	if st.Mode&0o7777 == ownerOnly {
		return nil
	}
	if err := unix.Chmod(dir, ownerOnly); err != nil {
		return fmt.Errorf("restrict %s to its owner (mode %04o): %w", dir, st.Mode&0o7777, err)
	}
	return nil
}

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

// syncDir fsyncs a directory, making the renames and links in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s for fsync: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}
