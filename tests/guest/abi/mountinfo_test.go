//go:build ovlkit_guest

package abi

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// optionCase is one overlay mount: the options asked for, beyond the
// layer directories, and the ones the super options must show for them.
type optionCase struct {
	opts []string
	show []string
}

// same is a case whose options all show as asked.
func same(opts ...string) optionCase { return optionCase{opts: opts, show: opts} }

// checkMountinfo mounts an overlay per case on fs and checks what
// github.com/moby/sys/mountinfo reads back for it: the mount point, the
// type, the source, and super options that are exactly "rw", the layer
// directories asked for, what the booted kernel's base shows for every new
// overlay (shownByDefault) and c.show, in any order. A mount the kernel
// refuses with EINVAL means it does not know one of the options.
func checkMountinfo(t *testing.T, fs guesttest.FS, cases []optionCase) {
	t.Helper()
	defaults := guesttest.ForBase(t, shownByDefault)
	for _, c := range cases {
		l := guesttest.NewLayers(t, fs.Scratch(t, ""), 2)
		if err := l.TryMount(t, c.opts...); err != nil {
			if errors.Is(err, unix.EINVAL) {
				t.Errorf("mount with %v: %v: this kernel does not know one of the options", c.opts, err)
			} else {
				t.Errorf("mount with %v: %v", c.opts, err)
			}
			continue
		}
		info := guesttest.OverlayEntry(t, l.Merged)
		if info.FSType != "overlay" || info.Source != "overlay" {
			t.Errorf("mount with %v: moby/sys/mountinfo reads fstype %q source %q, want overlay and overlay", c.opts, info.FSType, info.Source)
		}
		want := []string{
			"rw",
			"lowerdir=" + strings.Join(l.Lower, ":"),
			"upperdir=" + l.Upper,
			"workdir=" + l.Work,
		}
		want = append(append(want, defaults...), c.show...)
		got := strings.Split(info.VFSOptions, ",")
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("mount with %v: moby/sys/mountinfo reads super options %q, want exactly %v", c.opts, info.VFSOptions, want)
		}
	}
}

// TestMountinfoMoby mounts overlays with options every kernel has and
// checks that moby/sys/mountinfo reads them back as asked.
func TestMountinfoMoby(t *testing.T) {
	guesttest.Keeps(t, "/proc/self/mountinfo of overlays with stock options reads back through moby/sys/mountinfo")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		checkMountinfo(t, fs, []optionCase{
			same(),
			same("default_permissions"),
			same("index=on", "nfs_export=on"),
			same("redirect_dir=on", "metacopy=on"),
		})
	})
}

// TestMountinfoMobyStrictUpper shows strict_upper through moby/sys/mountinfo.
// strict_upper=off is the module default and is not shown.
func TestMountinfoMobyStrictUpper(t *testing.T) {
	guesttest.Proves(t, subjectStrictUpper)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		checkMountinfo(t, fs, []optionCase{
			same("strict_upper"),
			{opts: []string{"strict_upper=on"}, show: []string{"strict_upper"}},
			{opts: []string{"strict_upper=off"}},
			same("strict_upper", "redirect_dir=on", "index=on"),
		})
	})
}

// TestMountinfoMobyStrictOpaque shows strict_opaque through
// moby/sys/mountinfo.
func TestMountinfoMobyStrictOpaque(t *testing.T) {
	guesttest.Proves(t, subjectStrictOpaque)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		checkMountinfo(t, fs, []optionCase{
			same("strict_opaque"),
			{opts: []string{"strict_opaque=on"}, show: []string{"strict_opaque"}},
			{opts: []string{"strict_opaque=off"}},
			same("strict_opaque", "redirect_dir=on", "metacopy=on"),
		})
	})
}

// TestMountinfoMobyFsync shows the fsync= modes through moby/sys/mountinfo,
// alone and with stock options. On 6.12, whose series lacks the fsync=
// patch because the option is upstream, the harness judges it as a keeps
// test.
func TestMountinfoMobyFsync(t *testing.T) {
	guesttest.Proves(t, subjectFsync)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		checkMountinfo(t, fs, []optionCase{
			same("fsync=strict"),
			same("fsync=volatile"),
			{opts: []string{"fsync=auto"}},
			same("fsync=strict", "redirect_dir=on", "metacopy=on"),
		})
	})
}

// TestMountinfoMobyAllOptions shows every option the series adds, on one
// mount, through moby/sys/mountinfo. It proves the patch that adds the
// last of them in the series of the booted kernel's base: fsync= on 6.1,
// strict_opaque on 6.12.
func TestMountinfoMobyAllOptions(t *testing.T) {
	guesttest.Proves(t, guesttest.ForBase(t, lastOptionSubject))
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		checkMountinfo(t, fs, []optionCase{
			same("strict_upper", "fsync=strict", "strict_opaque"),
		})
	})
}
