package layer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"

	"golang.org/x/sys/unix"
)

// comparer walks two views of the same namespace and records what differs.
type comparer struct {
	ctx        context.Context
	oldV, newV *fsView
	// native restricts the walk to what the top layer of newV holds: the
	// lower layers of newV are exactly oldV's layers, so a directory whose
	// lower parts are the same on both sides differs only by the entries
	// of its top part.
	native bool
	out    []Change
	bufA   []byte
	bufB   []byte
}

func changes(ctx context.Context, diff string, lowers []string, opts ExportOptions) ([]Change, error) {
	prefix, err := opts.Whiteouts.xattrPrefix()
	if err != nil {
		return nil, err
	}
	layers := append([]string{diff}, lowers...)
	c := &comparer{
		ctx:    ctx,
		oldV:   &fsView{layers: lowers, prefix: prefix},
		newV:   &fsView{layers: layers, prefix: prefix},
		native: true,
	}
	if err := c.run(); err != nil {
		return nil, fmt.Errorf("layer: changes of %s: %w", diff, err)
	}
	return c.out, nil
}

func treeChanges(ctx context.Context, oldRoot, newRoot string) ([]Change, error) {
	c := &comparer{ctx: ctx, oldV: &fsView{}, newV: &fsView{layers: []string{newRoot}}}
	if oldRoot != "" {
		c.oldV.layers = []string{oldRoot}
	}
	if err := c.run(); err != nil {
		return nil, fmt.Errorf("layer: compare %s with %s: %w", oldRoot, newRoot, err)
	}
	return c.out, nil
}

func (c *comparer) run() error {
	o, n, err := roots(c.oldV, c.newV)
	if err != nil {
		return err
	}
	if _, err := c.dir("/", o, n); err != nil {
		return err
	}
	sort.Slice(c.out, func(i, j int) bool { return c.out[i].Path < c.out[j].Path })
	return nil
}

// sameLowerParts reports whether n's parts below the top layer are o's
// parts (newV's layer i+1 is oldV's layer i).
func sameLowerParts(o, n node) (topOnly bool, same bool) {
	rest := n.stack
	if len(rest) > 0 && rest[0].layer == 0 {
		topOnly = true
		rest = rest[1:]
	}
	if len(rest) != len(o.stack) {
		return topOnly, false
	}
	for i, p := range rest {
		if p.layer != o.stack[i].layer+1 || p.rel != o.stack[i].rel {
			return topOnly, false
		}
	}
	return topOnly, true
}

// dir compares the children of the directory at p (o and n are its two
// sides; o need not exist) and reports whether any change was recorded.
func (c *comparer) dir(p string, o, n node) (bool, error) {
	if err := c.ctx.Err(); err != nil {
		return false, err
	}
	var names []string
	var err error
	if !o.isDir() {
		o = node{}
	}
	if c.native {
		hasTop, same := sameLowerParts(o, n)
		switch {
		case same && !hasTop:
			return false, nil // nothing of the top layer here
		case same:
			names, err = c.newV.names(node{stack: n.stack[:1]})
		default:
			names, err = unionNames(c.oldV, o, c.newV, n)
		}
	} else {
		names, err = unionNames(c.oldV, o, c.newV, n)
	}
	if err != nil {
		return false, err
	}
	before := len(c.out)
	for _, name := range names {
		cp := path.Join(p, name)
		var oc, nc node
		if o.exists {
			if oc, err = c.oldV.lookup(o, name); err != nil {
				return false, err
			}
		}
		if nc, err = c.newV.lookup(n, name); err != nil {
			return false, err
		}
		switch {
		case !nc.exists && !oc.exists:
			continue
		case !nc.exists:
			c.out = append(c.out, Change{Path: cp, Kind: ChangeDelete})
			continue
		case !oc.exists:
			c.out = append(c.out, Change{Path: cp, Kind: ChangeAdd})
			if nc.isDir() {
				if _, err := c.dir(cp, node{}, nc); err != nil {
					return false, err
				}
			}
			continue
		}
		differ, err := c.differ(oc, nc)
		if err != nil {
			return false, err
		}
		if differ {
			c.out = append(c.out, Change{Path: cp, Kind: ChangeModify})
		}
		if nc.isDir() {
			sub, err := c.dir(cp, oc, nc)
			if err != nil {
				return false, err
			}
			// A directory whose content changed is reported too, so that
			// its permissions travel with the change set.
			if sub && !differ {
				c.out = append(c.out, Change{Path: cp, Kind: ChangeModify})
			}
		}
	}
	return len(c.out) > before, nil
}

func unionNames(ov *fsView, o node, nv *fsView, n node) ([]string, error) {
	a, err := nv.names(n)
	if err != nil {
		return nil, err
	}
	if !o.exists {
		return a, nil
	}
	b, err := ov.names(o)
	if err != nil {
		return nil, err
	}
	seen := make(map[string]bool, len(a))
	for _, s := range a {
		seen[s] = true
	}
	for _, s := range b {
		if !seen[s] {
			a = append(a, s)
		}
	}
	sort.Strings(a)
	return a, nil
}

// differ decides whether an entry present on both sides changed: type,
// permissions, owner, device number, xattrs; for non-directories also
// size, mtime, symlink target and finally content, so that a rewrite that
// kept size and mtime is still seen. A directory's mtime is not compared:
// it moves with every child change, which is reported on its own.
func (c *comparer) differ(o, n node) (bool, error) {
	ost, nst := &o.st, &n.st
	if ost.Mode != nst.Mode || ost.Uid != nst.Uid || ost.Gid != nst.Gid {
		return true, nil
	}
	kind := nst.Mode & unix.S_IFMT
	switch kind {
	case unix.S_IFCHR, unix.S_IFBLK:
		if ost.Rdev != nst.Rdev {
			return true, nil
		}
	}
	if kind != unix.S_IFDIR {
		if ost.Size != nst.Size || ost.Mtim != nst.Mtim {
			return true, nil
		}
	}
	ox, err := listXattrs(o.path)
	if err != nil {
		return false, err
	}
	nx, err := listXattrs(n.path)
	if err != nil {
		return false, err
	}
	if !sameXattrs(ox, nx) {
		return true, nil
	}
	switch kind {
	case unix.S_IFLNK:
		ot, err := os.Readlink(o.path)
		if err != nil {
			return false, err
		}
		nt, err := os.Readlink(n.path)
		if err != nil {
			return false, err
		}
		return ot != nt, nil
	case unix.S_IFREG:
		return c.contentDiffers(o, n)
	}
	return false, nil
}

// contentDiffers compares the data of two regular files of equal size. The
// same inode, or the same data file (a metacopy file over the lower it
// came from), is equal without reading.
func (c *comparer) contentDiffers(o, n node) (bool, error) {
	if o.data == "" || n.data == "" {
		return false, fmt.Errorf("no data for %s: metacopy file whose lower is not given", n.path)
	}
	if o.data == n.data {
		return false, nil
	}
	var ost, nst unix.Stat_t
	if err := unix.Stat(o.data, &ost); err != nil {
		return false, fmt.Errorf("stat %s: %w", o.data, err)
	}
	if err := unix.Stat(n.data, &nst); err != nil {
		return false, fmt.Errorf("stat %s: %w", n.data, err)
	}
	if ost.Dev == nst.Dev && ost.Ino == nst.Ino {
		return false, nil
	}
	fo, err := os.Open(o.data)
	if err != nil {
		return false, fmt.Errorf("open %s: %w", o.data, err)
	}
	defer fo.Close()
	fn, err := os.Open(n.data)
	if err != nil {
		return false, fmt.Errorf("open %s: %w", n.data, err)
	}
	defer fn.Close()
	if c.bufA == nil {
		c.bufA, c.bufB = make([]byte, 64<<10), make([]byte, 64<<10)
	}
	for {
		na, errA := io.ReadFull(fo, c.bufA)
		nb, errB := io.ReadFull(fn, c.bufB)
		if !bytes.Equal(c.bufA[:na], c.bufB[:nb]) {
			return true, nil
		}
		endA := errors.Is(errA, io.EOF) || errors.Is(errA, io.ErrUnexpectedEOF)
		endB := errors.Is(errB, io.EOF) || errors.Is(errB, io.ErrUnexpectedEOF)
		if errA != nil && !endA {
			return false, fmt.Errorf("read %s: %w", o.data, errA)
		}
		if errB != nil && !endB {
			return false, fmt.Errorf("read %s: %w", n.data, errB)
		}
		if endA || endB {
			return endA != endB, nil
		}
	}
}
