//go:build ovlkit_guest

package workdir

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// strictUpperParam is the module parameter that makes strict_upper the
// default of every overlay mount.
const strictUpperParam = "/sys/module/overlay/parameters/strict_upper"

// setStrictUpperParam sets the strict_upper module parameter to value for
// the rest of the test and restores the old value at its end. It fails
// the test when the kernel has no such parameter.
func setStrictUpperParam(t *testing.T, value string) {
	t.Helper()
	old, err := os.ReadFile(strictUpperParam)
	if err != nil {
		t.Fatalf("read the strict_upper module parameter: %v", err)
	}
	if err := os.WriteFile(strictUpperParam, []byte(value), 0o644); err != nil {
		t.Fatalf("set the strict_upper module parameter to %s: %v", value, err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(strictUpperParam, bytes.TrimSpace(old), 0o644); err != nil {
			t.Errorf("restore the strict_upper module parameter to %q: %v", old, err)
		}
	})
}

// liveUpperAndLowerOnly mounts an overlay A on base and returns it with
// the layers of a lower-only overlay whose top lower layer is A's upper
// dir and whose second lower layer holds the file "below".
func liveUpperAndLowerOnly(t *testing.T, base string) (a, ro guesttest.Layers) {
	t.Helper()
	a = guesttest.NewLayers(t, base, 1)
	guestfs.WriteFile(t, filepath.Join(a.Lower[0], "f"), "lower")
	a.Mount(t, "index=off")
	guestfs.WriteFile(t, filepath.Join(a.Merged, "from-a"), "a")

	second := filepath.Join(base, "lower-second")
	guestfs.MkdirAll(t, second)
	guestfs.WriteFile(t, filepath.Join(second, "below"), "below")
	ro = guesttest.Layers{
		Lower:  []string{a.Upper, second},
		Merged: filepath.Join(base, "merged-ro"),
	}
	guestfs.MkdirAll(t, ro.Merged)
	return a, ro
}

// readLowerOnly checks that the lower-only overlay ro shows what A wrote
// into its upper dir and the second lower layer, and that A still works.
func readLowerOnly(t *testing.T, a, ro guesttest.Layers) {
	t.Helper()
	for name, want := range map[string]string{"from-a": "a", "below": "below"} {
		b, err := os.ReadFile(filepath.Join(ro.Merged, name))
		if err != nil || string(b) != want {
			t.Errorf("read %s in the lower-only mount: %q, %v; want %q", name, b, err, want)
		}
	}
	if err := os.Remove(filepath.Join(a.Merged, "f")); err != nil {
		t.Errorf("unlink in the mount whose upper dir is a lower layer elsewhere: %v", err)
	}
}

// A lower-only overlay may use the live upper dir of another overlay as a
// lower layer with index=off: a warning, as on stock. strict_upper is
// about the upper layer and must not change that; the module parameter
// case is TestLowerOnlyOfLiveUpperStrictParam, which needs the parameter.
func TestLowerOnlyOfLiveUpper(t *testing.T) {
	guesttest.Keeps(t, "a lower-only mount of another overlay's live upper dir succeeds with index=off")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		a, ro := liveUpperAndLowerOnly(t, fs.Scratch(t, ""))
		kmsg := guesttest.OpenKmsg(t)
		if err := ro.TryMount(t, "index=off"); err != nil {
			t.Fatalf("lower-only mount of a live upper dir: %v", err)
		}
		if msg := kmsg.Expect(t, inUseMsg); !strings.HasPrefix(strings.TrimPrefix(msg, "overlayfs: "), "lowerdir") {
			t.Errorf("in-use message does not name the lowerdir: %q", msg)
		}
		readLowerOnly(t, a, ro)
	})
}

// With the strict_upper module parameter on (and with the option given to
// the lower-only mount itself) a lower layer that is another overlay's
// live upper dir is still only a warning with index=off: strict_upper
// judges the upper layer, and lower layers have no upper to judge.
func TestLowerOnlyOfLiveUpperStrictParam(t *testing.T) {
	guesttest.Proves(t, subjectStrictUpper)
	setStrictUpperParam(t, "Y")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		for _, c := range []struct {
			name  string
			extra []string
		}{
			{"param", []string{"index=off"}},
			{"param+option", []string{"index=off", "strict_upper"}},
		} {
			extra := c.extra
			t.Run(c.name, func(t *testing.T) {
				a, ro := liveUpperAndLowerOnly(t, fs.Scratch(t, ""))
				kmsg := guesttest.OpenKmsg(t)
				if err := ro.TryMount(t, extra...); err != nil {
					t.Fatalf("lower-only mount (%s) of a live upper dir with the strict_upper module parameter on: %v",
						strings.Join(extra, ","), err)
				}
				kmsg.Expect(t, inUseMsg)
				readLowerOnly(t, a, ro)
			})
		}
	})
}

// xfstests overlay/036: with index=off, a second mount with the same
// upperdir and another workdir and a third with the same workdir and
// another upperdir both succeed; with index=on both are EBUSY.
func TestSharedDirsIndexOff036(t *testing.T) {
	guesttest.Keeps(t, "xfstests overlay/036: shared upper or work dir allowed with index=off, EBUSY with index=on")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		base := fs.Scratch(t, "")
		a := guesttest.NewLayers(t, base, 1)
		guestfs.WriteFile(t, filepath.Join(a.Lower[0], "f"), "lower")
		a.Mount(t, "index=off")

		// other returns layers sharing a's upper dir (or its work dir)
		// with a fresh work dir (or upper dir) of their own.
		other := func(name string, sameUpper bool) guesttest.Layers {
			m := secondMount(t, a, base, "merged-"+name)
			dir := filepath.Join(base, "dir-"+name)
			guestfs.MkdirAll(t, dir)
			if sameUpper {
				m.Work = dir
			} else {
				m.Upper = dir
			}
			return m
		}
		for _, c := range []struct {
			index     string
			sameUpper bool
			want      unix.Errno
		}{
			{"index=off", true, 0},
			{"index=off", false, 0},
			{"index=on", true, unix.EBUSY},
			{"index=on", false, unix.EBUSY},
		} {
			shared := "workdir"
			if c.sameUpper {
				shared = "upperdir"
			}
			name := fmt.Sprintf("%s-%s", shared, strings.TrimPrefix(c.index, "index="))
			m := other(name, c.sameUpper)
			err := m.TryMount(t, c.index)
			if errnoOf(err) != c.want || (c.want == 0 && err != nil) {
				t.Errorf("mount sharing the %s with %s: got %v, want %v", shared, c.index, err, errOrNil(c.want))
			}
			if err == nil {
				if b, err := os.ReadFile(filepath.Join(m.Merged, "f")); err != nil || string(b) != "lower" {
					t.Errorf("read in the mount sharing the %s with %s: %q, %v", shared, c.index, b, err)
				}
			}
		}
		// Only reads: what the first mount stages in its work dir after
		// another mount joined it is TestSharedWorkdirKeepsFirstMountUsable.
		if b, err := os.ReadFile(filepath.Join(a.Merged, "f")); err != nil || string(b) != "lower" {
			t.Errorf("read in the first mount: %q, %v", b, err)
		}
	})
}

// errOrNil renders an expected errno, 0 meaning success.
func errOrNil(e unix.Errno) any {
	if e == 0 {
		return "success"
	}
	return e
}
