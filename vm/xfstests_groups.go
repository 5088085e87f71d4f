package vm

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path"
	"sort"
	"strconv"
	"strings"
)

// xfstestsDir is where scripts/xfstests-image.sh builds xfstests in the
// image.
const xfstestsDir = "/opt/xfstests"

// overlayTestDirs are the test directories ./check -overlay takes a group
// without a directory from: its SRC_GROUPS and the FSTYP's own.
var overlayTestDirs = []string{"generic", "overlay"}

// XfstestsGroup lists, in order, the tests ./check -overlay -g groups
// would run: groups is check's comma-separated list, each group either
// "dir/name" (generic/auto) or a name every overlay test directory is
// searched for. The lists are the tests/DIR/group.list files the image's
// xfstests build generated, the ones check itself reads, taken from the
// image with debugfs.
func XfstestsGroup(ctx context.Context, image, groups string) ([]string, error) {
	lists := map[string][]byte{}
	groupList := func(dir string) ([]byte, error) {
		if b, ok := lists[dir]; ok {
			return b, nil
		}
		p := path.Join(xfstestsDir, "tests", dir, "group.list")
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, "debugfs", "-R", "cat "+p, image)
		cmd.Stderr = &stderr
		b, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("debugfs cat %s in %s: %v: %s", p, image, err, strings.TrimSpace(stderr.String()))
		}
		// debugfs reports a missing file on stderr and exits 0.
		if len(b) == 0 {
			return nil, fmt.Errorf("%s in %s: empty or missing (xfstests not built in the image?): %s",
				p, image, strings.TrimSpace(stderr.String()))
		}
		lists[dir] = b
		return b, nil
	}
	seen := map[string]bool{}
	var tests []string
	for _, g := range strings.Split(groups, ",") {
		dirs, name := overlayTestDirs, g
		if d, n, ok := strings.Cut(g, "/"); ok {
			dirs, name = []string{d}, n
		}
		if name == "" {
			return nil, fmt.Errorf("xfstests group %q: no name", g)
		}
		var found []string
		for _, d := range dirs {
			b, err := groupList(d)
			if err != nil {
				return nil, err
			}
			found = append(found, parseGroupList(d, b, name)...)
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("xfstests group %q is empty or not defined", g)
		}
		for _, t := range found {
			if !seen[t] {
				seen[t] = true
				tests = append(tests, t)
			}
		}
	}
	sortTestNames(tests)
	return tests, nil
}

// parseGroupList returns the tests of dir that group.list b puts in
// group, as "dir/NNN": lines are a test name and its groups, and '#'
// starts a comment (check's get_sub_group_list).
func parseGroupList(dir string, b []byte, group string) []string {
	var tests []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		for _, g := range f[1:] {
			if g == group {
				tests = append(tests, dir+"/"+f[0])
				break
			}
		}
	}
	return tests
}

// sortTestNames orders tests by directory, then number, as check runs
// them.
func sortTestNames(tests []string) {
	sort.SliceStable(tests, func(i, j int) bool {
		di, ni, _ := strings.Cut(tests[i], "/")
		dj, nj, _ := strings.Cut(tests[j], "/")
		if di != dj {
			return di < dj
		}
		ai, erri := strconv.Atoi(ni)
		aj, errj := strconv.Atoi(nj)
		if erri == nil && errj == nil && ai != aj {
			return ai < aj
		}
		return ni < nj
	})
}

// A TestPart is one of Of contiguous, near-equal slices of a test list,
// numbered from 1, so that a selection too long for one sitting runs in
// parts whose union is the whole and which never overlap.
type TestPart struct{ N, Of int }

// ParseTestPart reads "N/OF", 1 <= N <= OF.
func ParseTestPart(s string) (TestPart, error) {
	a, b, ok := strings.Cut(s, "/")
	n, err1 := strconv.Atoi(a)
	of, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || of < 1 || n < 1 || n > of {
		return TestPart{}, fmt.Errorf("part %q: want N/OF with 1 <= N <= OF", s)
	}
	return TestPart{N: n, Of: of}, nil
}

// Select returns part p of tests.
func (p TestPart) Select(tests []string) []string {
	lo := (p.N - 1) * len(tests) / p.Of
	hi := p.N * len(tests) / p.Of
	return tests[lo:hi]
}
