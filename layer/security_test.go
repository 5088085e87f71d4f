package layer

import (
	"archive/tar"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// breakoutCase is one hostile layer, after go-archive's
// TestApplyLayerInvalidFilenames/Hardlink/Symlink and its untar variants.
// VICTIM in a name or target stands for the absolute path of a directory
// next to the root holding "hello".
type breakoutCase struct {
	name    string
	entries []ent
	// failOn is the entry the error must name; "" when the layer may
	// apply because nothing in it reaches outside (the victim check still
	// runs).
	failOn string
}

func breakoutCases() []breakoutCase {
	w := func(e ent) ent { return e }
	return []breakoutCase{
		{"dotdot file", []ent{reg("../victim/dotdot", "x", 0o644)}, "../victim/dotdot"},
		{"slash dotdot file", []ent{reg("/../victim/slash-dotdot", "x", 0o644)}, "/../victim/slash-dotdot"},
		{"absolute file", []ent{reg("VICTIM/abs", "x", 0o644)}, "VICTIM/abs"},
		{"dotdot in the middle", []ent{dir("a/", 0o755), reg("a/../../victim/x", "x", 0o644)}, "a/../../victim/x"},
		{"hardlink dotdot", []ent{hardlink("dotdot", "../victim/hello")}, "dotdot"},
		{"hardlink slash dotdot", []ent{hardlink("slash-dotdot", "/../victim/hello")}, "slash-dotdot"},
		{"hardlink absolute", []ent{hardlink("abs", "VICTIM/hello")}, "abs"},
		{"symlink dotdot", []ent{symlink("dotdot", "../victim/hello")}, "dotdot"},
		{"symlink dotdot deep", []ent{dir("a/", 0o755), symlink("a/up", "../../victim")}, "a/up"},
		// An absolute target is resolved in the container's root: allowed,
		// and never followed while applying.
		{"symlink slash dotdot", []ent{symlink("slash-dotdot", "/../victim/hello")}, ""},
		{"symlink loophole write", []ent{symlink("loophole", "VICTIM"), reg("loophole/file", "x", 0o644)}, "loophole/file"},
		{"symlink loophole mkdir", []ent{symlink("loophole", "VICTIM"), dir("loophole/newdir/", 0o755), reg("loophole/newdir/newfile", "x", 0o644)}, "loophole/newdir/"},
		{"symlink loophole overwrite", []ent{symlink("loophole", "VICTIM"), reg("loophole/hello", "pwned", 0o644)}, "loophole/hello"},
		{"symlink chain", []ent{symlink("a", "b"), symlink("b", "VICTIM"), reg("a/file", "x", 0o644)}, "a/file"},
		{"symlink via root", []ent{symlink("r", "/"), reg("r/"+"VICTIM_REL/hello", "x", 0o644)}, "r/VICTIM_REL/hello"},
		{"symlink then hardlink", []ent{symlink("sym", "VICTIM"), hardlink("hl", "sym/hello")}, "hl"},
		{"symlink then whiteout", []ent{symlink("sym", "VICTIM"), reg("sym/.wh.hello", "", 0o600)}, "sym/.wh.hello"},
		{"symlink then opaque", []ent{symlink("sym", "VICTIM"), reg("sym/.wh..wh..opq", "", 0o600)}, "sym/.wh..wh..opq"},
		{"symlink then device", []ent{symlink("sym", "VICTIM"), w(ent{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "sym/fifo", Mode: 0o644}})}, "sym/fifo"},
		{"symlink then symlink", []ent{symlink("sym", "VICTIM"), symlink("sym/evil", "/etc/passwd")}, "sym/evil"},
		// Replacing the symlink replaces the link, not what it points to.
		{"replace the victim", []ent{symlink("sym", "VICTIM"), reg("sym", "x", 0o644)}, ""},
		{"replace the victim dir", []ent{symlink("sym", "VICTIM"), dir("sym/", 0o755)}, ""},
		{"hardlink to symlink", []ent{symlink("sym", "VICTIM/hello"), hardlink("hl", "sym"), reg("hl", "pwned", 0o644)}, ""},
		{"hardlink to itself", []ent{reg("f", "x", 0o644), hardlink("f", "f")}, "f"},
	}
}

func TestApplyBreakouts(t *testing.T) {
	for _, tc := range breakoutCases() {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			victim := filepath.Join(base, "victim")
			root := filepath.Join(base, "root")
			mkdirs(t, root)
			writeFile(t, filepath.Join(victim, "hello"), "hello", 0o644)
			before := tree(t, victim)
			rel := strings.TrimPrefix(victim, "/")
			fix := func(s string) string {
				s = strings.ReplaceAll(s, "VICTIM_REL", rel)
				return strings.ReplaceAll(s, "VICTIM", victim)
			}
			var es []ent
			for _, e := range tc.entries {
				e.hdr.Name = fix(e.hdr.Name)
				e.hdr.Linkname = fix(e.hdr.Linkname)
				es = append(es, e)
			}
			_, err := applyBytes(t, root, mkTar(t, es...), ApplyOptions{})
			if tc.failOn != "" {
				var ee *EntryError
				if !errors.As(err, &ee) {
					t.Fatalf("got %v, want an error naming %q", err, fix(tc.failOn))
				}
				if ee.Name != fix(tc.failOn) {
					t.Errorf("error names %q, want %q (%v)", ee.Name, fix(tc.failOn), err)
				}
				if !strings.Contains(err.Error(), fix(tc.failOn)) {
					t.Errorf("message %q does not name the entry", err)
				}
			} else if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			equalLists(t, "victim after apply", tree(t, victim), before)
			if entries, _ := os.ReadDir(base); len(entries) != 2 {
				t.Errorf("apply left %d entries next to the root, want 2", len(entries))
			}
		})
	}
}

// TestApplyBreakoutErrorKinds pins the sentinel for path escapes, so the
// graph package can tell a hostile layer from an I/O error.
func TestApplyBreakoutErrorKinds(t *testing.T) {
	for _, es := range [][]ent{
		{reg("../x", "", 0o644)},
		{symlink("s", "/"), reg("s/tmp/x", "", 0o644)},
		{hardlink("h", "../x")},
	} {
		_, err := applyBytes(t, t.TempDir(), mkTar(t, es...), ApplyOptions{})
		if !errors.Is(err, ErrUnsafePath) {
			t.Errorf("%s: got %v, want ErrUnsafePath", es[len(es)-1].hdr.Name, err)
		}
	}
}
