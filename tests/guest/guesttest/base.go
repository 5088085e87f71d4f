//go:build ovlkit_guest

package guesttest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// KernelBase returns the kernel base of the booted kernel: the major and
// minor number of its release ("6.1" for 6.1.192, "6.12" for 6.12.118),
// which names the series (patches/<base>) the harness judges proofs
// against. The stock and the patched kernel of a base have the same
// release, so a test may choose by base what it proves or keeps, or what
// a base shows by default, and still run the same assertions on both
// kernels of the base. It must never choose by probing a feature: that
// would differ between stock and patched.
//
// The test fails when the release cannot be read or does not match the
// base the harness passes in OVLKIT_KBASE: the harness would then judge
// the test against the series of another base.
func KernelBase(t testing.TB) string {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatalf("uname: %v", err)
	}
	release := unix.ByteSliceToString(u.Release[:])
	base, err := releaseBase(release)
	if err != nil {
		t.Fatalf("kernel base: %v", err)
	}
	if want := os.Getenv("OVLKIT_KBASE"); want != "" && want != base {
		t.Fatalf("booted kernel %s is of base %s, but the harness judges this run against patches/%s", release, base, want)
	}
	return base
}

// releaseBase returns "MAJOR.MINOR" of a kernel release such as
// "6.12.118" or "6.1.0-13-amd64".
func releaseBase(release string) (string, error) {
	f := strings.FieldsFunc(release, func(r rune) bool { return r == '.' || r == '-' || r == '+' })
	if len(f) < 2 {
		return "", fmt.Errorf("kernel release %q has no major.minor", release)
	}
	for _, n := range f[:2] {
		if _, err := strconv.ParseUint(n, 10, 32); err != nil {
			return "", fmt.Errorf("kernel release %q has no numeric major.minor: %w", release, err)
		}
	}
	return f[0] + "." + f[1], nil
}

// ForBase returns the entry of perBase for the booted kernel's base (see
// KernelBase), for example the subject a test proves on each base:
//
//	guesttest.Proves(t, guesttest.ForBase(t, map[string]string{
//		"6.1":  "ovl: add fsync=auto|strict|volatile mount option",
//		"6.12": "ovl: sync the data of a metacopy file before removing its metacopy xattr",
//	}))
//
// The test fails when perBase has no entry for the base: a test scoped per
// base must say what it does on every base it runs on, so a new base is
// not judged by another base's expectations.
func ForBase[T any](t testing.TB, perBase map[string]T) T {
	t.Helper()
	base := KernelBase(t)
	v, ok := perBase[base]
	if !ok {
		t.Fatalf("this test says nothing about kernel base %s", base)
	}
	return v
}
