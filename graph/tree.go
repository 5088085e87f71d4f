package graph

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ovlkit/ovlkit/ovl"
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

// buildView writes, at dst, the full tree that layer id shows (hardlink
// layout): the nearest image ancestor's tree hard-linked, then the diffs
// of the container layers above it applied in order. id "" gives an empty
// 0755 directory.
func (s *Store) buildView(st *state, id, dst string) error {
	if id == "" {
		return mkdirLike(dst, "")
	}
	chain, err := st.chain(id)
	if err != nil {
		return err
	}
	var diffs []string
	base := ""
	for _, cid := range chain {
		if !st.Layers[cid].RW {
			base = s.rootDir(cid)
			break
		}
		diffs = append(diffs, s.diffDir(cid))
	}
	if base == "" {
		if err := mkdirLike(dst, ""); err != nil {
			return err
		}
	} else if err := linkTree(base, dst); err != nil {
		return err
	}
	for i := len(diffs) - 1; i >= 0; i-- {
		if err := mergeDiff(diffs[i], dst); err != nil {
			return err
		}
	}
	return nil
}

// linkTree recreates src at dst: directories are made with the same mode,
// owner, xattrs and times, everything else is hard-linked. This is the
// seed's image layer construction and its cost: one new inode per
// directory and one link per file.
func linkTree(src, dst string) error {
	type dirMeta struct{ src, dst string }
	var dirs []dirMeta
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, dirMeta{p, target})
			return nil
		}
		return os.Link(p, target)
	})
	if err != nil {
		return fmt.Errorf("hard-link copy of %s: %w", src, err)
	}
	// Metadata last and deepest first: times would change while entries
	// are added, and a read-only directory could not take them.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := copyDirMeta(dirs[i].src, dirs[i].dst); err != nil {
			return err
		}
	}
	return nil
}

// copyDirMeta copies mode, owner, xattrs (except overlay's own) and times.
func copyDirMeta(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return fmt.Errorf("stat %s: %w", src, err)
	}
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("chown %s: %w", dst, err)
	}
	if err := chmodFull(dst, os.FileMode(st.Mode&0o7777)); err != nil {
		return err
	}
	if err := copyXattrs(src, dst); err != nil {
		return err
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", dst, err)
	}
	return nil
}

func listXattrs(path string) ([]string, error) {
	sz, err := unix.Llistxattr(path, nil)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
	}
	if sz == 0 {
		return nil, nil
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(path, buf)
	if err != nil {
		return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
	}
	var names []string
	for _, n := range strings.Split(string(buf[:sz]), "\x00") {
		if n != "" {
			names = append(names, n)
		}
	}
	return names, nil
}

func getXattr(path, name string) ([]byte, error) {
	sz, err := unix.Lgetxattr(path, name, nil)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, sz)
	sz, err = unix.Lgetxattr(path, name, buf)
	if err != nil {
		return nil, err
	}
	return buf[:sz], nil
}

func copyXattrs(src, dst string) error {
	names, err := listXattrs(src)
	if err != nil {
		return err
	}
	for _, n := range names {
		if ovl.IsPrivate(n) {
			continue
		}
		v, err := getXattr(src, n)
		if err != nil {
			return fmt.Errorf("read xattr %s of %s: %w", n, src, err)
		}
		if err := unix.Lsetxattr(dst, n, v, 0); err != nil {
			return fmt.Errorf("set xattr %s on %s: %w", n, dst, err)
		}
	}
	return nil
}

// isWhiteout reports a 0/0 character device, overlay's whiteout.
func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

func isOpaque(path string) bool {
	for _, ns := range []ovl.XattrNS{ovl.Trusted, ovl.User} {
		if v, err := getXattr(path, ns.Name(ovl.XattrOpaque)); err == nil && string(v) == "y" {
			return true
		}
	}
	return false
}

// mergeDiff applies an overlay diff directory to a full tree, as the
// kernel would show diff over root: whiteouts delete, opaque directories
// replace, directories merge, everything else replaces by a hard link.
// Redirected directories and metacopy files point into other layers and
// cannot be flattened by linking, so they are refused rather than copied
// wrongly.
func mergeDiff(diff, root string) error {
	type dirMeta struct{ src, dst string }
	var dirs []dirMeta
	err := filepath.WalkDir(diff, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(diff, p)
		if err != nil {
			return err
		}
		target := filepath.Join(root, rel)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		for _, ns := range []ovl.XattrNS{ovl.Trusted, ovl.User} {
			for _, x := range []string{ovl.XattrRedirect, ovl.XattrMetacopy} {
				if _, err := getXattr(p, ns.Name(x)); err == nil {
					return fmt.Errorf("%s carries %s: a layer using redirect_dir or metacopy cannot be flattened into a hardlink tree", p, ns.Name(x))
				}
			}
		}
		if rel == "." {
			if isOpaque(p) {
				if err := clearDir(target); err != nil {
					return err
				}
			}
			dirs = append(dirs, dirMeta{p, target})
			return nil
		}
		if isWhiteout(&st) {
			return os.RemoveAll(target)
		}
		if d.IsDir() {
			fi, err := os.Lstat(target)
			if err == nil && fi.IsDir() && !isOpaque(p) {
				dirs = append(dirs, dirMeta{p, target})
				return nil
			}
			if err := os.RemoveAll(target); err != nil {
				return err
			}
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, dirMeta{p, target})
			return nil
		}
		if err := os.RemoveAll(target); err != nil {
			return err
		}
		return os.Link(p, target)
	})
	if err != nil {
		return fmt.Errorf("merge %s into %s: %w", diff, root, err)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := copyDirMeta(dirs[i].src, dirs[i].dst); err != nil {
			return err
		}
	}
	return nil
}

// clearDir removes everything inside dir.
func clearDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
