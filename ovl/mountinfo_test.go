package ovl

import (
	"slices"
	"testing"

	"github.com/moby/sys/mountinfo"
)

func TestDeepestFirst(t *testing.T) {
	infos := []*mountinfo.Info{{Mountpoint: "/s/a"}, {Mountpoint: "/s/a b/merged"}, {Mountpoint: "/s"}}
	got := deepestFirst(infos)
	want := []string{"/s/a b/merged", "/s/a", "/s"}
	if !slices.Equal(got, want) {
		t.Errorf("deepestFirst = %q, want %q", got, want)
	}
}

// The root is a mount point in every mount namespace, and a prefix is
// matched by whole path components.
func TestMountsBeneath(t *testing.T) {
	all, err := MountsBeneath("/")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) == 0 || all[len(all)-1] != "/" {
		t.Errorf("MountsBeneath(/) = %q, want / last", all)
	}
	none, err := MountsBeneath(t.TempDir() + "/no-such-mount")
	if err != nil {
		t.Fatal(err)
	}
	if len(none) != 0 {
		t.Errorf("MountsBeneath of an unmounted directory = %q", none)
	}
}
