package ovl

import "strings"

// XattrNS is the namespace overlay keeps its private xattrs in: trusted.*
// normally, user.* for mounts with the userxattr option.
type XattrNS string

// The two namespaces overlayfs uses.
const (
	Trusted XattrNS = "trusted.overlay."
	User    XattrNS = "user.overlay."
)

// Names of the overlay xattrs, relative to a namespace.
const (
	XattrOpaque   = "opaque"
	XattrRedirect = "redirect"
	XattrOrigin   = "origin"
	XattrImpure   = "impure"
	XattrNlink    = "nlink"
	XattrUpper    = "upper"
	XattrMetacopy = "metacopy"
	XattrProtattr = "protattr"
	XattrWhiteout = "whiteout"
)

// Name returns the full xattr name of x in ns, e.g. trusted.overlay.opaque.
func (ns XattrNS) Name(x string) string { return string(ns) + x }

// IsPrivate reports whether name is an overlay xattr in either namespace.
// Such xattrs must never come from a tar layer: a hostile layer could plant
// redirects or metacopy pointers into other layers.
func IsPrivate(name string) bool {
	return strings.HasPrefix(name, string(Trusted)) || strings.HasPrefix(name, string(User))
}
