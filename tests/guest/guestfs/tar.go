//go:build ovlkit_guest

package guestfs

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"sort"
	"strings"
)

// TarFiles lists what a layer's tar holds that a test compares by
// content: each regular file as its path (rooted, "/d/f") to the hex
// sha256 of its data, each symlink as its path to "-> target".
// Directories, whiteouts and metadata are left to tests that look for
// them. It returns an error rather than failing the test, for callers
// that collect what they find (a report of a cut) before judging it.
func TarFiles(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read tar: %w", err)
		}
		name := "/" + strings.Trim(strings.TrimPrefix(h.Name, "./"), "/")
		switch h.Typeflag {
		case tar.TypeReg:
			sum := sha256.New()
			if _, err := io.Copy(sum, tr); err != nil {
				return nil, fmt.Errorf("read %s from tar: %w", name, err)
			}
			out[name] = hex.EncodeToString(sum.Sum(nil))
		case tar.TypeSymlink:
			out[name] = "-> " + h.Linkname
		}
	}
}

// DiffFiles says how got differs from want (both as TarFiles returns
// them): "missing P", "changed P" and "extra P", sorted and joined by
// ", ", or "" when they are the same.
func DiffFiles(got, want map[string]string) string {
	var d []string
	for p, w := range want {
		if g, ok := got[p]; !ok {
			d = append(d, "missing "+p)
		} else if g != w {
			d = append(d, "changed "+p)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			d = append(d, "extra "+p)
		}
	}
	sort.Strings(d)
	return strings.Join(d, ", ")
}
