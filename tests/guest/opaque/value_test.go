//go:build ovlkit_guest

package opaque

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// badValues are opaque xattr values that layer tools are known to write
// and that overlayfs does not take as "opaque". Each must be reported.
var badValues = []struct {
	name, value string
}{
	{"yes", "yes"},
	{"y-newline", "y\n"},
	{"one", "1"},
	// Longer than any buffer the kernel reads the value into: getxattr
	// fails with ERANGE, which stock kernels take as "not opaque".
	{"overlong", strings.Repeat("y", 256)},
}

// valueLayers makes an upper and two lower layers on fs.
func valueLayers(t *testing.T, fs guesttest.FS) guesttest.Layers {
	t.Helper()
	return guesttest.NewLayers(t, fs.Scratch(t, ""), 2)
}

// addValueDir makes dir in lower1 holding "secret" and dir in the layer
// named by where ("upper" or "lower0") holding "mine", with that dir's
// opaque xattr set to value (no xattr when value is empty).
func addValueDir(t *testing.T, l guesttest.Layers, ns xattrNS, where, dir, value string) {
	t.Helper()
	layer := l.Upper
	if where == "lower0" {
		layer = l.Lower[0]
	}
	guestfs.MkdirAll(t, filepath.Join(l.Lower[1], dir))
	guestfs.WriteFile(t, filepath.Join(l.Lower[1], dir, "secret"), "lower\n")
	d := filepath.Join(layer, dir)
	guestfs.MkdirAll(t, d)
	guestfs.WriteFile(t, filepath.Join(d, "mine"), where+"\n")
	if value != "" {
		setXattr(t, d, ns.opaque(), value)
	}
}

// Every value other than "y" used to mean "not opaque" without a trace,
// exposing what the layer meant to hide. Without strict_opaque the lookup
// still merges (as before), but the kernel names the directory.
func TestOpaqueInvalidValueWarns(t *testing.T) {
	guesttest.Proves(t, subjectValidate)
	forEachNS(t, func(t *testing.T, fs guesttest.FS, ns xattrNS) {
		l := valueLayers(t, fs)
		for i, bv := range badValues {
			addValueDir(t, l, ns, "upper", fmt.Sprintf("bad%d", i), bv.value)
		}
		addValueDir(t, l, ns, "lower0", "badlower", "yes")
		addValueDir(t, l, ns, "upper", "good", "y")
		addValueDir(t, l, ns, "upper", "plain", "")
		k := guesttest.OpenKmsg(t)
		l.Mount(t, ns.mount...)

		for i, bv := range badValues {
			dir := fmt.Sprintf("bad%d", i)
			t.Run(bv.name, func(t *testing.T) {
				expectNames(t, merged(l, dir), "mine", "secret")
				want := []string{"invalid " + ns.opaque(), "upper/" + dir + " "}
				if m, all := kmsgMatches(t, k, want...); len(m) == 0 {
					t.Errorf("no kernel warning containing %q after looking up %s; log:\n%s",
						want, dir, strings.Join(all, "\n"))
				}
			})
		}
		t.Run("lower-layer", func(t *testing.T) {
			expectNames(t, merged(l, "badlower"), "mine", "secret")
			want := []string{"invalid " + ns.opaque(), "lower0/badlower "}
			if m, all := kmsgMatches(t, k, want...); len(m) == 0 {
				t.Errorf("no kernel warning containing %q; log:\n%s", want, strings.Join(all, "\n"))
			}
		})
		// Valid and absent values stay silent and keep their meaning.
		t.Run("valid", func(t *testing.T) {
			expectNames(t, merged(l, "good"), "mine")
			expectNames(t, merged(l, "plain"), "mine", "secret")
			if m, _ := kmsgMatches(t, k, ".overlay.opaque"); len(m) != 0 {
				t.Errorf("warnings for valid or absent opaque xattrs: %q", m)
			}
		})
	})
}

// "x" is what 6.8 and later write on a lower directory that holds xattr
// whiteouts. 6.1 cannot read those, so the user must be told once per
// mount that entries meant to be deleted are visible. 6.12 reads them, and
// its version of the patch takes "x" as valid: there is nothing to warn
// about there, and TestOpaqueXattrWhiteoutsHide keeps what 6.12 does.
func TestOpaqueXattrWhiteoutsWarnOnce(t *testing.T) {
	if base := guesttest.KernelBase(t); base != "6.1" {
		t.Skipf("kernel base %s reads xattr whiteouts (upstream since 6.8) and patches/%s takes an opaque xattr of \"x\" as valid; TestOpaqueXattrWhiteoutsHide keeps that", base, base)
	}
	guesttest.Proves(t, subjectValidate)
	forEachNS(t, func(t *testing.T, fs guesttest.FS, ns xattrNS) {
		l := valueLayers(t, fs)
		addValueDir(t, l, ns, "lower0", "x1", "x")
		addValueDir(t, l, ns, "lower0", "x2", "x")
		k := guesttest.OpenKmsg(t)
		l.Mount(t, ns.mount...)

		// Not opaque: both layers show, as a 6.8 kernel would show them
		// (minus the xattr whiteouts, which these dirs do not have).
		expectNames(t, merged(l, "x1"), "mine", "secret")
		expectNames(t, merged(l, "x2"), "mine", "secret")
		m, all := kmsgMatches(t, k, "xattr whiteouts")
		if len(m) != 1 {
			t.Fatalf("got %d warnings about xattr whiteouts for two opaque=x dirs on one mount, want 1; log:\n%s",
				len(m), strings.Join(all, "\n"))
		}
		if !strings.Contains(m[0], ns.opaque()) {
			t.Errorf("warning %q does not name %s", m[0], ns.opaque())
		}
	})
}

// On 6.12 (upstream since 6.8) an opaque xattr of "x" on a lower directory
// means it holds xattr whiteouts: empty regular files with an
// overlay.whiteout xattr, which hide the entries of the layers below as a
// 0/0 character device does. The directory itself is merged, not opaque.
// The 6.12 series validates the opaque xattr and must take "x" as valid:
// no warning, and the whiteouts keep hiding. 6.1 has no xattr whiteouts
// (TestOpaqueXattrWhiteoutsWarnOnce proves its warning about them).
func TestOpaqueXattrWhiteoutsHide(t *testing.T) {
	if base := guesttest.KernelBase(t); base == "6.1" {
		t.Skipf("kernel base %s has no xattr whiteouts (upstream since 6.8); TestOpaqueXattrWhiteoutsWarnOnce proves the warning about them", base)
	}
	guesttest.Keeps(t, "an opaque xattr of \"x\" on a lower dir merges it and its xattr whiteouts hide lower entries, without a warning")
	forEachNS(t, func(t *testing.T, fs guesttest.FS, ns xattrNS) {
		l := valueLayers(t, fs)
		addValueDir(t, l, ns, "lower0", "x1", "x")
		addValueDir(t, l, ns, "lower0", "x2", "x")
		for _, dir := range []string{"x1", "x2"} {
			guestfs.WriteFile(t, filepath.Join(l.Lower[1], dir, "gone"), "lower\n")
			guestfs.WriteFile(t, filepath.Join(l.Lower[0], dir, "gone"), "")
			setXattr(t, filepath.Join(l.Lower[0], dir, "gone"), ns.name+".overlay.whiteout", "")
		}
		k := guesttest.OpenKmsg(t)
		l.Mount(t, ns.mount...)
		for _, dir := range []string{"x1", "x2"} {
			expectNames(t, merged(l, dir), "mine", "secret")
			expectENOENT(t, merged(l, dir, "gone"))
		}
		if m, _ := kmsgMatches(t, k, ns.name+".overlay."); len(m) != 0 {
			t.Errorf("warnings for an opaque xattr of \"x\" or its xattr whiteouts: %q", m)
		}
	})
}

// With strict_opaque, a directory whose opaque xattr cannot be trusted is
// an I/O error rather than a guess that might expose hidden files.
func TestOpaqueInvalidValueStrictEIO(t *testing.T) {
	guesttest.Proves(t, subjectValidate)
	forEachNS(t, func(t *testing.T, fs guesttest.FS, ns xattrNS) {
		l := valueLayers(t, fs)
		for i, bv := range badValues {
			addValueDir(t, l, ns, "upper", fmt.Sprintf("bad%d", i), bv.value)
		}
		addValueDir(t, l, ns, "lower0", "badlower", "1")
		addValueDir(t, l, ns, "upper", "good", "y")
		addValueDir(t, l, ns, "upper", "plain", "")
		k := guesttest.OpenKmsg(t)
		l.Mount(t, append([]string{"strict_opaque"}, ns.mount...)...)

		check := func(t *testing.T, dir, layer string) {
			var st unix.Stat_t
			err := unix.Lstat(merged(l, dir), &st)
			if !errors.Is(err, unix.EIO) {
				t.Errorf("lstat %s with an invalid opaque xattr under strict_opaque: %v, want EIO", dir, err)
			}
			if _, err := guesttest.ReadNames(merged(l, dir)); !errors.Is(err, unix.EIO) {
				t.Errorf("readdir %s under strict_opaque: %v, want EIO", dir, err)
			}
			want := []string{"invalid " + ns.opaque(), layer + "/" + dir + " "}
			if m, all := kmsgMatches(t, k, want...); len(m) == 0 {
				t.Errorf("no kernel warning containing %q; log:\n%s", want, strings.Join(all, "\n"))
			}
		}
		for i, bv := range badValues {
			dir := fmt.Sprintf("bad%d", i)
			t.Run(bv.name, func(t *testing.T) { check(t, dir, "upper") })
		}
		t.Run("lower-layer", func(t *testing.T) { check(t, "badlower", "lower0") })
		t.Run("valid", func(t *testing.T) {
			expectNames(t, merged(l, "good"), "mine")
			expectNames(t, merged(l, "plain"), "mine", "secret")
		})
	})
}

// Regression: without strict_opaque an invalid value, on the upper or a
// middle lower layer, means "not opaque" exactly as on a kernel without
// the check: the directory and what the lower layer holds stay readable.
func TestOpaqueInvalidValueStillReadable(t *testing.T) {
	guesttest.Keeps(t, "an invalid opaque xattr value leaves the dir readable and not opaque")
	values := append(slices.Clone(badValues), struct{ name, value string }{"x", "x"})
	forEachNS(t, func(t *testing.T, fs guesttest.FS, ns xattrNS) {
		l := valueLayers(t, fs)
		for i, v := range values {
			addValueDir(t, l, ns, "upper", fmt.Sprintf("up%d", i), v.value)
			addValueDir(t, l, ns, "lower0", fmt.Sprintf("mid%d", i), v.value)
		}
		l.Mount(t, ns.mount...)
		for i, v := range values {
			t.Run(v.name, func(t *testing.T) {
				for _, dir := range []string{fmt.Sprintf("up%d", i), fmt.Sprintf("mid%d", i)} {
					var st unix.Stat_t
					if err := unix.Lstat(merged(l, dir), &st); err != nil {
						t.Errorf("lstat %s: %v", dir, err)
						continue
					}
					expectNames(t, merged(l, dir), "mine", "secret")
					if b, err := os.ReadFile(merged(l, dir, "secret")); err != nil || string(b) != "lower\n" {
						t.Errorf("read %s/secret = %q, %v; want the lower file", dir, b, err)
					}
				}
			})
		}
	})
}

// Regression: "y" keeps hiding the layers below, on upper and on a
// middle lower layer, in both namespaces, without any warning.
func TestOpaqueValidValueHidesLower(t *testing.T) {
	guesttest.Keeps(t, "an opaque xattr of \"y\" hides the lower dir")
	forEachNS(t, func(t *testing.T, fs guesttest.FS, ns xattrNS) {
		l := valueLayers(t, fs)
		addValueDir(t, l, ns, "upper", "up", "y")
		addValueDir(t, l, ns, "lower0", "mid", "y")
		k := guesttest.OpenKmsg(t)
		l.Mount(t, ns.mount...)
		expectNames(t, merged(l, "up"), "mine")
		expectNames(t, merged(l, "mid"), "mine")
		expectENOENT(t, merged(l, "up", "secret"))
		expectENOENT(t, merged(l, "mid", "secret"))
		if m, _ := kmsgMatches(t, k, "opaque"); len(m) != 0 {
			t.Errorf("warnings for valid opaque xattrs: %q", m)
		}
	})
}
