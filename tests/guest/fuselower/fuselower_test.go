//go:build ovlkit_guest

package fuselower

import (
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// Subject of the patch the strict test proves, exactly as in patches/6.1.
const subjectValidate = "ovl: validate the opaque xattr value"

// Markers of the log lines that make up the documentation table: one per
// case, with the cell of each variant.
const (
	rowMarker       = "fuselower-row: "
	strictRowMarker = "fuselower-strict-row: "
)

// defaultCell is what stock shows for c: "y" makes d opaque, and every
// other value and every getxattr error means "not opaque". A lookup never
// fails because of the opaque xattr.
func (c opaqueCase) defaultCell() string {
	if c.answer.errno == 0 && c.answer.value == "y" {
		return cellOpaque
	}
	return cellNotOpaque
}

func lookupFails(e unix.Errno) string { return "lookup of d fails: " + errnoLabel(e) }

// strictCells lists what strict_opaque shows for c in v. A getxattr
// error fails the lookup with that error, except those that mean "no
// opaque xattr here": ENODATA, EOPNOTSUPP (ENOSYS reaches overlayfs as
// EOPNOTSUPP) and, in the user namespace, EACCES. An invalid value fails
// the lookup with EIO, and so does ERANGE, which is what a value longer
// than the kernel reads gives: an invalid value too. "x" is reported, not
// called invalid, and is never opaque.
func (c opaqueCase) strictCells(v variant) []string {
	switch e := c.answer.errno; e {
	case 0:
		switch c.answer.value {
		case "y":
			return []string{cellOpaque}
		case "x":
			// Written by 6.8 and later for xattr whiteouts.
			return []string{cellNotOpaque}
		}
		return []string{lookupFails(unix.EIO)}
	case unix.ENODATA, unix.EOPNOTSUPP, unix.ENOSYS:
		return []string{c.defaultCell()}
	case unix.EACCES:
		if v.userxattr {
			return []string{c.defaultCell()}
		}
	case unix.ERANGE:
		return []string{lookupFails(unix.EIO)}
	}
	return []string{lookupFails(c.answer.errno)}
}

func logKmsg(t *testing.T, o observation) {
	t.Helper()
	for _, line := range o.kmsg {
		t.Logf("kmsg: %s", line)
	}
}

func variantNames() string {
	var names []string
	for _, v := range variants {
		names = append(names, v.name)
	}
	return strings.Join(names, " | ")
}

// A FUSE or virtiofs lower whose getxattr of the opaque xattr fails, with
// whatever error its server gives, is readable on stock kernels: the error
// means "not opaque". Without strict_opaque the series must keep exactly
// that, and keep "y" as the only value that makes a directory opaque.
func TestFUSELowerOpaqueDefault(t *testing.T) {
	guesttest.Keeps(t, "a FUSE lower whose opaque xattr cannot be read stays readable, as on stock")
	t.Logf("%scase | %s", rowMarker, variantNames())
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cells := make([]string, len(variants))
			for i, v := range variants {
				t.Run(v.name, func(t *testing.T) {
					o, _ := observe(t, c, v)
					cells[i] = o.cell()
					logKmsg(t, o)
					if o.mountErr != nil {
						t.Fatalf("mount overlay on the FUSE lower: %v", o.mountErr)
					}
					if o.calls == 0 {
						t.Errorf("the FUSE server got no getxattr of %s on d: this case shows nothing", v.opaqueName())
					}
					if got, want := cells[i], c.defaultCell(); got != want {
						t.Errorf("FUSE lower answering %s: %s, want %s as on stock (%s)", c.label, got, want, o.detail())
					}
				})
			}
			t.Logf("%s%s | %s", rowMarker, c.label, strings.Join(cells, " | "))
		})
	}
}

// With strict_opaque, a getxattr error of the opaque xattr fails the
// lookup with that error and an invalid value fails it with EIO, instead of
// guessing "not opaque" and exposing what the layer may have meant to hide;
// "no such xattr" and "no xattr support" still mean "not opaque". Stock
// kernels do not know the option and refuse the mount.
func TestFUSELowerStrictOpaque(t *testing.T) {
	guesttest.Proves(t, subjectValidate)
	t.Logf("%scase | %s", strictRowMarker, variantNames())
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cells := make([]string, len(variants))
			for i, v := range variants {
				t.Run(v.name, func(t *testing.T) {
					o, l := observe(t, c, v, "strict_opaque")
					cells[i] = o.cell()
					logKmsg(t, o)
					if o.mountErr != nil {
						t.Fatalf("mount overlay on the FUSE lower with strict_opaque: %v", o.mountErr)
					}
					opts, err := superOptions(l.Merged)
					if err != nil {
						t.Fatalf("options of the overlay: %v", err)
					}
					if !slices.Contains(opts, "strict_opaque") {
						t.Errorf("overlay options %q do not show strict_opaque", opts)
					}
					if o.calls == 0 {
						t.Errorf("the FUSE server got no getxattr of %s on d: this case shows nothing", v.opaqueName())
					}
					if want := c.strictCells(v); !slices.Contains(want, cells[i]) {
						t.Errorf("FUSE lower answering %s with strict_opaque: %s, want %s (%s)",
							c.label, cells[i], strings.Join(want, " or "), o.detail())
					}
				})
			}
			t.Logf("%s%s | %s", strictRowMarker, c.label, strings.Join(cells, " | "))
		})
	}
}
