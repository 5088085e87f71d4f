package vm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const sampleGroupList = `# QA groups control file, automatically generated.
# See _begin_fstest in each test for details.

001 rw dir udf auto quick
002 metadata udf auto quick
010 other auto
011 dangerous_fuzzers # auto in a comment is no group
100 autofs
`

func TestParseGroupList(t *testing.T) {
	for _, tc := range []struct {
		group string
		want  []string
	}{
		{"auto", []string{"generic/001", "generic/002", "generic/010"}},
		{"quick", []string{"generic/001", "generic/002"}},
		{"autofs", []string{"generic/100"}},
		{"dangerous_fuzzers", []string{"generic/011"}},
		{"nosuch", nil},
	} {
		got := parseGroupList("generic", []byte(sampleGroupList), tc.group)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("group %s: got %q, want %q", tc.group, got, tc.want)
		}
	}
}

func TestSortTestNames(t *testing.T) {
	got := []string{"overlay/002", "generic/1000", "generic/999", "generic/010", "overlay/001"}
	sortTestNames(got)
	want := []string{"generic/010", "generic/999", "generic/1000", "overlay/001", "overlay/002"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestTestPartCovers(t *testing.T) {
	for _, n := range []int{0, 1, 7, 10, 777} {
		var tests []string
		for i := 0; i < n; i++ {
			tests = append(tests, "generic/"+strings.Repeat("x", i%3)+string(rune('a'+i%26)))
		}
		for _, of := range []int{1, 3, 10, 12} {
			var union []string
			for i := 1; i <= of; i++ {
				part := TestPart{N: i, Of: of}.Select(tests)
				if d := len(part) - n/of; d < 0 || d > 1 {
					t.Errorf("%d tests, part %d/%d has %d", n, i, of, len(part))
				}
				union = append(union, part...)
			}
			if !reflect.DeepEqual(union, tests) && !(n == 0 && len(union) == 0) {
				t.Errorf("%d tests in %d parts: the parts do not make the list", n, of)
			}
		}
	}
}

func TestParseTestPart(t *testing.T) {
	if p, err := ParseTestPart("3/10"); err != nil || p != (TestPart{3, 10}) {
		t.Errorf("3/10: %v, %v", p, err)
	}
	for _, bad := range []string{"", "3", "0/10", "11/10", "1/0", "a/b", "-1/3", "1/3/4"} {
		if _, err := ParseTestPart(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestXfstestsGroup reads group lists from an ext4 image laid out as
// scripts/xfstests-image.sh builds it, through debugfs.
func TestXfstestsGroup(t *testing.T) {
	for _, tool := range []string{"mkfs.ext4", "debugfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not installed (scripts/deps.sh installs e2fsprogs)", tool)
		}
	}
	root := t.TempDir()
	write := func(dir, text string) {
		d := filepath.Join(root, "opt", "xfstests", "tests", dir)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "group.list"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("generic", sampleGroupList)
	write("overlay", "001 auto quick copyup\n002 auto\n")
	img := filepath.Join(t.TempDir(), "root.img")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", root, img, "8M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		groups string
		want   []string
	}{
		{"quick", []string{"generic/001", "generic/002", "overlay/001"}},
		{"generic/auto", []string{"generic/001", "generic/002", "generic/010"}},
		{"overlay/auto,quick", []string{"generic/001", "generic/002", "overlay/001", "overlay/002"}},
	} {
		got, err := XfstestsGroup(ctx, img, tc.groups)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %q, %v; want %q", tc.groups, got, err, tc.want)
		}
	}
	for _, bad := range []string{"nosuch", "generic/", "xfs/auto"} {
		if got, err := XfstestsGroup(ctx, img, bad); err == nil {
			t.Errorf("%s: got %q, no error", bad, got)
		}
	}
}
