package layer

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/ovlkit/ovlkit/ovl"
	"golang.org/x/sys/unix"
)

// This file flattens overlay diff directories into full trees, the
// hardlink layout's image layers: a parent's tree is hard-linked and a
// diff is merged into it as the kernel would show the diff over it.

// treeDir is a directory made while a tree is built, whose metadata is
// copied from src once its entries are in place.
type treeDir struct{ src, dst string }

// LinkTree recreates src at dst: directories are made with the same mode,
// owner, xattrs (except overlay's own) and times, everything else is
// hard-linked. It costs one new inode per directory and one link per file.
func LinkTree(src, dst string) error {
	var dirs []treeDir
	err := walkRel(src, func(p, rel string, d fs.DirEntry) error {
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, treeDir{p, target})
			return nil
		}
		return os.Link(p, target)
	})
	if err != nil {
		return fmt.Errorf("hard-link copy of %s: %w", src, err)
	}
	return finishTreeDirs(dirs)
}

// MergeDiff applies an overlay diff directory to a full tree, as the
// kernel would show diff over root: whiteouts (0/0 character devices)
// delete, opaque directories replace, directories merge, everything else
// replaces by a hard link. Redirected directories and metacopy files point
// into other layers and cannot be flattened by linking, so they are
// refused rather than copied wrongly.
func MergeDiff(diff, root string) error {
	var dirs []treeDir
	err := walkRel(diff, func(p, rel string, d fs.DirEntry) error {
		dir, err := mergeEntry(p, filepath.Join(root, rel), rel == ".", d.IsDir())
		if dir != nil {
			dirs = append(dirs, *dir)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("merge %s into %s: %w", diff, root, err)
	}
	return finishTreeDirs(dirs)
}

// walkRel walks the tree at root, parents before children, and calls fn
// with each path, its path relative to root ("." for root) and its entry.
func walkRel(root string, fn func(p, rel string, d fs.DirEntry) error) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		return fn(p, rel, d)
	})
}

// mergeEntry merges the diff entry p into target, the same path in the
// tree; it returns the directory whose metadata must follow, if any.
func mergeEntry(p, target string, isRoot, isDir bool) (*treeDir, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return nil, err
	}
	if err := refuseUnflattenable(p); err != nil {
		return nil, err
	}
	opaque := false
	if isRoot || isDir {
		var err error
		if opaque, err = hasOpaqueMarker(p); err != nil {
			return nil, err
		}
	}
	switch {
	case isRoot:
		if opaque {
			if err := clearDir(target); err != nil {
				return nil, err
			}
		}
		return &treeDir{p, target}, nil
	case st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0:
		return nil, os.RemoveAll(target)
	case isDir:
		if fi, err := os.Lstat(target); err == nil && fi.IsDir() && !opaque {
			return &treeDir{p, target}, nil
		}
		if err := os.RemoveAll(target); err != nil {
			return nil, err
		}
		if err := os.Mkdir(target, 0o700); err != nil {
			return nil, err
		}
		return &treeDir{p, target}, nil
	}
	if err := os.RemoveAll(target); err != nil {
		return nil, err
	}
	return nil, os.Link(p, target)
}

// refuseUnflattenable fails for an entry with a redirect or metacopy
// xattr in either overlay namespace.
func refuseUnflattenable(p string) error {
	for _, ns := range overlayNamespaces {
		for _, x := range []string{ovl.XattrRedirect, ovl.XattrMetacopy} {
			if _, ok, err := lgetxattr(p, ns.Name(x)); err != nil {
				return err
			} else if ok {
				return fmt.Errorf("%s carries %s: a layer using redirect_dir or metacopy cannot be flattened into a hardlink tree", p, ns.Name(x))
			}
		}
	}
	return nil
}

// hasOpaqueMarker reports an opaque directory in either overlay namespace.
func hasOpaqueMarker(p string) (bool, error) {
	for _, ns := range overlayNamespaces {
		v, ok, err := lgetxattr(p, ns.Name(ovl.XattrOpaque))
		if err != nil {
			return false, err
		}
		if ok && string(v) == "y" {
			return true, nil
		}
	}
	return false, nil
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

// finishTreeDirs copies the metadata of the directories made, last and
// deepest first: times would change while entries are added, and a
// read-only directory could not take them.
func finishTreeDirs(dirs []treeDir) error {
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
	// unix.Chmod: os.Chmod would map setuid, setgid and sticky bits.
	if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
		return fmt.Errorf("chmod %s: %w", dst, err)
	}
	xattrs, err := listXattrs(src)
	if err != nil {
		return err
	}
	for _, n := range sortedKeys(xattrs) {
		if err := unix.Lsetxattr(dst, n, xattrs[n], 0); err != nil {
			return fmt.Errorf("set xattr %s on %s: %w", n, dst, err)
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", dst, err)
	}
	return nil
}
