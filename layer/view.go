package layer

import (
	"errors"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// fsView resolves paths through a stack of layer directories the way
// overlayfs merges them: whiteouts hide, opaque directories stop the
// merge, redirect_dir sends the lookup of a renamed directory to its
// origin, and a metacopy file takes its data from below. With an empty
// prefix the layers are plain trees and nothing is interpreted.
type fsView struct {
	layers []string // top first
	prefix string   // "trusted.overlay." or "user.overlay."; "" for plain trees
}

// dirPart is one directory contributing to a merged directory: the path
// rel inside layers[layer].
type dirPart struct {
	layer int
	rel   string
}

// node is a resolved path of a view.
type node struct {
	exists bool
	st     unix.Stat_t // of the topmost entry: the metadata the merge shows
	path   string      // on-disk path holding the metadata
	data   string      // on-disk path holding a regular file's content
	layer  int         // layer index of path

	// For directories: the merged directories, top first.
	stack []dirPart
	// opaque and redirected describe the topmost directory.
	opaque, redirected bool
}

func (n *node) isDir() bool { return n.exists && n.st.Mode&unix.S_IFMT == unix.S_IFDIR }

// roots returns the merged roots of the two views a comparison walks.
func roots(oldV, newV *fsView) (o, n node, err error) {
	if o, err = oldV.root(); err != nil {
		return o, n, err
	}
	n, err = newV.root()
	return o, n, err
}

// root returns the merged root. The root of every layer takes part;
// overlayfs does not apply an opaque marker on the root of a layer.
func (v *fsView) root() (node, error) {
	n := node{exists: true, st: unix.Stat_t{Mode: unix.S_IFDIR | 0o755}}
	for i, l := range v.layers {
		var st unix.Stat_t
		if err := unix.Lstat(l, &st); err != nil {
			return node{}, fmt.Errorf("layer root %s: %w", l, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return node{}, fmt.Errorf("layer root %s is not a directory", l)
		}
		if i == 0 {
			n.st, n.path, n.layer = st, l, 0
		}
		n.stack = append(n.stack, dirPart{layer: i, rel: ""})
	}
	return n, nil
}

// lookupPath resolves a relative path from the root.
func (v *fsView) lookupPath(rel string) (node, error) {
	n, err := v.root()
	if err != nil {
		return node{}, err
	}
	if rel == "" {
		return n, nil
	}
	for _, c := range strings.Split(rel, "/") {
		if !n.isDir() {
			return node{}, nil
		}
		if n, err = v.lookup(n, c); err != nil {
			return node{}, err
		}
	}
	return n, nil
}

func (v *fsView) isWhiteout(full string, st *unix.Stat_t) (bool, error) {
	if v.prefix == "" {
		return false, nil
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		return st.Rdev == 0, nil
	case unix.S_IFREG:
		if st.Size != 0 {
			return false, nil
		}
		_, ok, err := lgetxattr(full, v.prefix+"whiteout")
		return ok, err
	}
	return false, nil
}

func (v *fsView) xattr(full, name string) (string, bool, error) {
	if v.prefix == "" {
		return "", false, nil
	}
	b, ok, err := lgetxattr(full, v.prefix+name)
	return string(b), ok, err
}

func (v *fsView) isOpaque(full string) (bool, error) {
	val, ok, err := v.xattr(full, "opaque")
	return ok && val == "y", err
}

// lookup resolves the child name of the merged directory parent.
func (v *fsView) lookup(parent node, name string) (node, error) {
	return v.lookupKnown(parent, name, "", nil, false)
}

// lookupKnown is lookup with the lstat of one path, known, already made by
// the caller: the lookup takes it instead of asking again. bare says the
// caller found known without any xattr, so without the overlay's: the
// lookup then reads none of them there.
func (v *fsView) lookupKnown(parent node, name, known string, knownSt *unix.Stat_t, bare bool) (node, error) {
	var res node
	needData := false
	parts := parent.stack
	cur := name // the name looked up in the remaining parts; redirects change it
	for k := 0; k < len(parts); k++ {
		p := parts[k]
		rel := path.Join(p.rel, cur)
		full := filepath.Join(v.layers[p.layer], rel)
		var st unix.Stat_t
		noXattrs := false
		if knownSt != nil && full == known {
			st, noXattrs = *knownSt, bare
		} else if err := unix.Lstat(full, &st); err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
				continue
			}
			return node{}, fmt.Errorf("lookup %s: %w", full, err)
		}
		var wh bool
		var err error
		if !noXattrs || st.Mode&unix.S_IFMT == unix.S_IFCHR {
			if wh, err = v.isWhiteout(full, &st); err != nil {
				return node{}, err
			}
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if !res.exists {
			if wh {
				return node{}, nil
			}
			res = node{exists: true, st: st, path: full, layer: p.layer}
		} else if res.isDir() {
			// Below a directory only directories merge; anything else ends
			// the merge, as in the kernel.
			if wh || !isDir {
				break
			}
		} else {
			// Looking for the data of a metacopy file.
			if wh || st.Mode&unix.S_IFMT != unix.S_IFREG {
				break
			}
		}
		if isDir {
			opaque, redirect, err := v.mergeDir(&res, full, dirPart{layer: p.layer, rel: rel}, noXattrs)
			if err != nil {
				return node{}, err
			}
			if opaque {
				break
			}
			if redirect != "" {
				parts, cur, k = v.redirectParts(parts, k, p.layer, redirect)
			}
			continue
		}
		meta, redirect := false, ""
		if !noXattrs {
			if meta, redirect, err = v.metacopy(full, &st); err != nil {
				return node{}, err
			}
		}
		if !meta {
			res.data = full
			break
		}
		needData = true
		if redirect != "" {
			parts, cur, k = v.redirectParts(parts, k, p.layer, redirect)
		}
	}
	if needData && res.data == "" {
		return node{}, fmt.Errorf("metacopy file %s: its data is in none of the lower layers", res.path)
	}
	return res, nil
}

// mergeDir adds the directory full, part of a merged directory, to res.
// It reports whether the directory is opaque, which ends the merge, and
// where its redirect sends the lookup ("" for nowhere); the topmost
// directory's flags are recorded in res. bare: full has no xattrs.
func (v *fsView) mergeDir(res *node, full string, part dirPart, bare bool) (bool, string, error) {
	res.stack = append(res.stack, part)
	if bare {
		return false, "", nil
	}
	opaque, err := v.isOpaque(full)
	if err != nil {
		return false, "", err
	}
	if len(res.stack) == 1 {
		res.opaque = opaque
	}
	if opaque {
		return true, "", nil
	}
	redirect, ok, err := v.xattr(full, "redirect")
	if err != nil || !ok {
		return false, "", err
	}
	if len(res.stack) == 1 && redirect != "" {
		res.redirected = true
	}
	return false, redirect, nil
}

// metacopy reports whether full (with st) is a metacopy file, whose data
// is in a layer below, and where its redirect sends the search for the
// data ("" for nowhere).
func (v *fsView) metacopy(full string, st *unix.Stat_t) (bool, string, error) {
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size == 0 {
		return false, "", nil
	}
	_, meta, err := v.xattr(full, "metacopy")
	if err != nil || !meta {
		return false, "", err
	}
	redirect, ok, err := v.xattr(full, "redirect")
	if err != nil || !ok {
		return true, "", err
	}
	return true, redirect, nil
}

// redirectParts continues a lookup after a redirect found in layer: an
// absolute redirect restarts from the root of every layer below, a
// relative one renames the entry within the same parent. It returns the
// new parts, name and loop index (the caller's loop increments it).
func (v *fsView) redirectParts(parts []dirPart, k, layer int, redirect string) ([]dirPart, string, int) {
	if strings.HasPrefix(redirect, "/") {
		var below []dirPart
		for i := layer + 1; i < len(v.layers); i++ {
			below = append(below, dirPart{layer: i, rel: ""})
		}
		return below, strings.Trim(path.Clean(redirect), "/"), -1
	}
	return parts, redirect, k
}

// names returns the candidate child names of a merged directory, sorted:
// the union over its parts, including names that a whiteout hides (the
// caller's lookup tells).
func (v *fsView) names(n node) ([]string, error) {
	seen := make(map[string]bool)
	var out []string
	for _, p := range n.stack {
		dir := filepath.Join(v.layers[p.layer], p.rel)
		list, err := readDirNames(dir)
		if err != nil {
			return nil, err
		}
		for _, name := range list {
			if !seen[name] {
				seen[name] = true
				out = append(out, name)
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// readDirNames lists the names in dir, unsorted, through a plain
// descriptor: os.Open's registration with the runtime poller, which a
// directory refuses, costs more system calls than the listing of a small
// one, and an export lists every directory of a diff.
func readDirNames(dir string) ([]string, error) {
	fd, err := openNoEINTR(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(fd)
	var names []string
	buf := make([]byte, 8192)
	for {
		n, err := unix.ReadDirent(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", dir, err)
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// openNoEINTR is open(2) retried on EINTR.
func openNoEINTR(path string, flags int) (int, error) {
	for {
		fd, err := unix.Open(path, flags, 0)
		if !errors.Is(err, unix.EINTR) {
			return fd, err
		}
	}
}

// fdReader reads a plain descriptor (see readDirNames for why not an
// *os.File).
type fdReader int

func (r fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(int(r), p)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return 0, err
		case n == 0 && len(p) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}
