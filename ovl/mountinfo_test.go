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

func TestUnescapeMountField(t *testing.T) {
	for in, want := range map[string]string{
		"/plain":                       "/plain",
		`/a\040b`:                      "/a b",
		`/t\011ab\012nl\134bs`:         "/t\tab\nnl\\bs",
		`l1\054x\072y:l2`:              "l1,x:y:l2",
		`/end\`:                        `/end\`,
		`/short\04`:                    `/short\04`,
		`/not\089octal`:                `/not\089octal`,
		`/over\400`:                    `/over\400`,
		`\134\134`:                     `\\`,
		`/\303\251t\303\251`:           "/été",
		`/mixed\040\`:                  `/mixed \`,
		`lowerdir=/a\054b,upperdir=/u`: "lowerdir=/a,b,upperdir=/u",
	} {
		if got := UnescapeMountField(in); got != want {
			t.Errorf("UnescapeMountField(%q) = %q, want %q", in, got, want)
		}
	}
}
