package layer

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/ovlkit/ovlkit/ovl"
	"golang.org/x/sys/unix"
)

// overlayNamespaces are the namespaces overlayfs keeps its own state in.
// Their xattrs never travel in a tar: on apply they could plant redirects
// or opaque markers, on export they would leak one layer's mount state
// into another (see ovl.IsPrivate).
var overlayNamespaces = [...]ovl.XattrNS{ovl.Trusted, ovl.User}

// paxXattrPrefix is how tar carries xattrs in PAX records (the form GNU tar,
// bsdtar and Go's archive/tar agree on).
const paxXattrPrefix = "SCHILY.xattr."

// lgetxattr reads one xattr without following a final symlink. It returns
// (nil, false, nil) when the xattr is absent or the filesystem has none.
func lgetxattr(path, name string) ([]byte, bool, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(path, name, buf)
		switch {
		case err == nil:
			return buf[:n], true, nil
		case errors.Is(err, unix.ERANGE):
			sz, err := unix.Lgetxattr(path, name, nil)
			if err != nil {
				return nil, false, fmt.Errorf("getxattr %s %s: %w", path, name, err)
			}
			buf = make([]byte, sz+1)
		case errors.Is(err, unix.ENODATA), errors.Is(err, unix.EOPNOTSUPP):
			return nil, false, nil
		default:
			return nil, false, fmt.Errorf("getxattr %s %s: %w", path, name, err)
		}
	}
}

// listXattrs returns every xattr of path except overlayfs' own, without
// following a final symlink.
// hasNoXattrs reports whether path (not followed) surely has no xattrs:
// listxattr says there are none. An error says nothing.
func hasNoXattrs(path string) bool {
	n, err := unix.Llistxattr(path, nil)
	return err == nil && n == 0
}

func listXattrs(path string) (map[string][]byte, error) {
	return ReadXattrs(path, func(name string) bool { return !ovl.IsPrivate(name) })
}

// ReadXattrs returns the xattrs of path whose names keep accepts (all of
// them when keep is nil), without following a final symlink; nil when
// there are none or the filesystem has no xattrs. One removed while they
// are read is left out. It is the one reader of xattr sets: tar layers
// and the store's manifests agree on what a file holds.
func ReadXattrs(path string, keep func(name string) bool) (map[string][]byte, error) {
	sz, err := unix.Llistxattr(path, nil)
	if err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return nil, nil
		}
		return nil, fmt.Errorf("listxattr %s: %w", path, err)
	}
	if sz == 0 {
		return nil, nil
	}
	buf := make([]byte, sz+64)
	for {
		sz, err = unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listxattr %s: %w", path, err)
		}
		break
	}
	var out map[string][]byte
	for _, name := range bytes.Split(buf[:sz], []byte{0}) {
		if len(name) == 0 || (keep != nil && !keep(string(name))) {
			continue
		}
		v, ok, err := lgetxattr(path, string(name))
		if err != nil {
			return nil, err
		}
		if !ok {
			continue // removed while we listed
		}
		if out == nil {
			out = make(map[string][]byte)
		}
		out[string(name)] = v
	}
	return out, nil
}

// sameXattrs compares two xattr sets as listXattrs returns them.
func sameXattrs(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}
