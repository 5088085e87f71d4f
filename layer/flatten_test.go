package layer

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// LinkTree of a lower and MergeDiff of an upper over it give the tree
// that flatten, the tests' independent reference, makes of the two.
func TestMergeDiffMatchesFlatten(t *testing.T) {
	base := t.TempDir()
	lower, upper := filepath.Join(base, "lower"), filepath.Join(base, "upper")
	build(t, lower,
		d("a"), f("a/f1", "one"), f("a/f2", "two"), d("b"), f("c", "c"),
		d("d"), d("d/e"), f("d/e/f", "f"), f("d/keep", "k"), l("link", "t1"), f("x", "file"),
	)
	build(t, upper,
		d("a"), f("a/f1", "ONE"), f("a/new", "n"),
		d("b").withMode(0o700).with("trusted.note", "v"),
		wh("c"),
		d("d").with("trusted.overlay.opaque", "y"), f("d/g", "g"),
		l("link", "t2"),
		d("x"), f("x/in", "dir over file"),
		wh("never-existed"),
	)
	tree := filepath.Join(base, "tree")
	if err := LinkTree(lower, tree); err != nil {
		t.Fatal(err)
	}
	if err := MergeDiff(upper, tree); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(base, "want")
	flatten(t, want, lower, upper)
	ch, err := TreeChanges(context.Background(), want, tree)
	if err != nil {
		t.Fatal(err)
	}
	equalLists(t, "differences from the reference", changeStrings(ch), nil)
}

// A redirect or a metacopy file points into another layer; flattening it
// by links would be wrong, so MergeDiff refuses.
func TestMergeDiffRefusesRedirect(t *testing.T) {
	for _, x := range []string{"trusted.overlay.redirect", "user.overlay.metacopy"} {
		base := t.TempDir()
		upper, tree := filepath.Join(base, "upper"), filepath.Join(base, "tree")
		build(t, upper, d("moved").with(x, "/old"))
		build(t, tree)
		err := MergeDiff(upper, tree)
		if err == nil || !strings.Contains(err.Error(), x) {
			t.Errorf("MergeDiff of a directory with %s: %v, want a refusal naming it", x, err)
		}
	}
}
