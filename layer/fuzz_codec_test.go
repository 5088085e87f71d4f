package layer

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// codecNames are the path components fuzzed tars are made of: ordinary
// names, names that are whiteouts of them, the opaque marker, AUFS
// bookkeeping, the invalid whiteouts, and names that are only odd.
var codecNames = []string{
	"a", "b", "c",
	".wh.a", ".wh.b", ".wh.c",
	whiteoutOpaque, ".wh..wh.plnk",
	".wh.", ".wh..", ".wh...", "x\ny", ".wh.x\ny",
}

// codecEntry is one entry of a fuzzed tar.
type codecEntry struct {
	name string // clean, relative, no trailing slash
	dir  bool
}

func (e codecEntry) String() string {
	if e.dir {
		return strconv.Quote(e.name + "/")
	}
	return strconv.Quote(e.name)
}

// target is the path an entry acts on in the diff: a whiteout's hidden
// name, an opaque marker's directory ("" for the root), or the entry's own
// path; kind is 'w', 'o', '-' (AUFS bookkeeping, or below it: ignored) or
// 'e'.
func (e codecEntry) target() (string, byte) {
	dir, base := path.Split(e.name)
	dir = strings.TrimSuffix(dir, "/")
	for _, c := range strings.Split(dir, "/") {
		if strings.HasPrefix(c, whiteoutMetaPrefix) {
			return "", '-' // inside AUFS bookkeeping: ignored as a whole
		}
	}
	switch {
	case base == whiteoutOpaque:
		return dir, 'o'
	case strings.HasPrefix(base, whiteoutMetaPrefix):
		return "", '-'
	case strings.HasPrefix(base, whiteoutPrefix):
		return path.Join(dir, base[len(whiteoutPrefix):]), 'w'
	}
	return e.name, 'e'
}

// decodeCodecEntries turns fuzz bytes into at most 16 entries: per entry
// one byte for the kind and depth, then one byte per component.
func decodeCodecEntries(data []byte) []codecEntry {
	var out []codecEntry
	for len(data) > 0 && len(out) < 16 {
		k := data[0]
		data = data[1:]
		depth := 1 + int(k>>1)%3
		var parts []string
		for i := 0; i < depth && len(data) > 0; i++ {
			parts = append(parts, codecNames[int(data[0])%len(codecNames)])
			data = data[1:]
		}
		if len(parts) == 0 {
			break
		}
		out = append(out, codecEntry{name: strings.Join(parts, "/"), dir: k&1 == 1})
	}
	return out
}

func codecTar(t testing.TB, entries []codecEntry) []byte {
	var ents []ent
	for _, e := range entries {
		if e.dir {
			ents = append(ents, dir(e.name+"/", 0o755))
		} else {
			ents = append(ents, reg(e.name, "", 0o644))
		}
	}
	return mkTar(t, ents...)
}

// overlayForm is what a diff directory says in overlay terms: its
// whiteouts and opaque directories ("" is the root), sorted.
type overlayForm struct {
	whiteouts, opaque []string
}

// readOverlayForm walks a diff. It fails the test on an overlay xattr
// in the namespace the format does not use, and on an entry that is not a
// whiteout but is named like one: exported, it would turn into a whiteout.
func readOverlayForm(t *testing.T, diff string, format WhiteoutFormat) overlayForm {
	t.Helper()
	prefix, err := format.xattrPrefix()
	if err != nil {
		t.Fatal(err)
	}
	other := "user.overlay."
	if prefix == other {
		other = "trusted.overlay."
	}
	v := &fsView{prefix: prefix}
	var f overlayForm
	err = filepath.Walk(diff, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(diff, p)
		if rel == "." {
			rel = ""
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		xs, err := listXattrs(p)
		if err != nil {
			return err
		}
		for k := range xs {
			if strings.HasPrefix(k, other) {
				t.Fatalf("%s: xattr %s in a %v diff", rel, k, format)
			}
		}
		wh, err := v.isWhiteout(p, &st)
		if err != nil {
			return err
		}
		switch {
		case wh:
			f.whiteouts = append(f.whiteouts, rel)
		case strings.HasPrefix(path.Base(rel), whiteoutPrefix):
			t.Fatalf("%s: an entry named like a whiteout in the diff", rel)
		case st.Mode&unix.S_IFMT == unix.S_IFDIR:
			if opq, err := v.isOpaque(p); err != nil {
				return err
			} else if opq {
				f.opaque = append(f.opaque, rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", diff, err)
	}
	sort.Strings(f.whiteouts)
	sort.Strings(f.opaque)
	return f
}

// tarOverlayForm is the same for a tar layer: its .wh. entries (AUFS
// bookkeeping aside) and opaque markers. Any other entry named like a
// whiteout fails the test.
func tarOverlayForm(t *testing.T, b []byte) overlayForm {
	t.Helper()
	var f overlayForm
	for _, h := range tarHeaders(t, b) {
		name := strings.TrimSuffix(h.Name, "/")
		target, kind := codecEntry{name: name}.target()
		switch kind {
		case 'w':
			if h.Typeflag != tar.TypeReg || h.Size != 0 {
				t.Fatalf("whiteout entry %q of type %q, size %d", h.Name, h.Typeflag, h.Size)
			}
			f.whiteouts = append(f.whiteouts, target)
		case 'o':
			f.opaque = append(f.opaque, target)
		case '-':
			t.Fatalf("export wrote AUFS bookkeeping %q", h.Name)
		}
	}
	sort.Strings(f.whiteouts)
	sort.Strings(f.opaque)
	return f
}

func has(list []string, s string) bool {
	i := sort.SearchStrings(list, s)
	return i < len(list) && list[i] == s
}

func topComponent(p string) string { return strings.SplitN(p, "/", 2)[0] }

// FuzzWhiteoutCodec fuzzes the mapping between tar names and overlay
// whiteouts and opaque markers, both ways, on tars built from names that
// are or look like whiteouts. After Apply:
//   - a whiteout or opaque directory in the diff is one the tar asked for
//     (a directory made over a whiteout is opaque as well), in the
//     format's xattr namespace only, and nothing else there is named
//     like a whiteout;
//   - an entry that no later entry of its subtree touched has its effect:
//     the whiteout is there when its parent is, the directory is opaque;
//   - Export (lowers unknown, so every marker is kept) writes exactly the
//     diff's whiteouts and opaque markers, and so does the export of the
//     diff with its whiteouts in xattr form when the format reads it;
//   - applying that export gives the same tree.
//
// An error must name the entry it failed on.
func FuzzWhiteoutCodec(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, user bool) {
		format := OverlayWhiteouts
		if user {
			format = OverlayUserWhiteouts
		}
		entries := decodeCodecEntries(data)
		b := codecTar(t, entries)
		base := t.TempDir()
		diff := filepath.Join(base, "diff")
		mkdirs(t, diff)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := Apply(ctx, diff, bytes.NewReader(b), ApplyOptions{Whiteouts: format}); err != nil {
			var ee *EntryError
			if !errors.As(err, &ee) {
				t.Fatalf("Apply error names no entry: %v", err)
			}
			return
		}
		got := readOverlayForm(t, diff, format)

		askedWh, askedOpq := map[string]bool{}, map[string]bool{}
		for _, e := range entries {
			switch p, kind := e.target(); kind {
			case 'w':
				askedWh[p] = true
			case 'o':
				askedOpq[p] = true
			}
		}
		for _, w := range got.whiteouts {
			if !askedWh[w] {
				t.Fatalf("whiteout %q that no entry asked for; entries %v", w, entries)
			}
		}
		for _, o := range got.opaque {
			if !askedOpq[o] && !askedWh[o] {
				t.Fatalf("opaque directory %q that no entry asked for; entries %v", o, entries)
			}
		}
		for i, e := range entries {
			p, kind := e.target()
			if kind != 'w' && kind != 'o' {
				continue
			}
			last := true
			for _, later := range entries[i+1:] {
				q, k := later.target()
				if k != '-' && !(k == 'o' && q == "") && topComponent(q) == topComponent(p) {
					last = false
				}
			}
			if p == "" && kind == 'o' {
				last = true // only a root entry, never generated, clears the root's marker
			}
			if !last {
				continue
			}
			if kind == 'o' && !has(got.opaque, p) {
				t.Fatalf("entry %q: %q is not opaque; entries %v", e.name, p, entries)
			}
			if kind == 'w' && !has(got.whiteouts, p) {
				if fi, err := os.Lstat(filepath.Join(diff, path.Dir(p))); err == nil && fi.IsDir() {
					t.Fatalf("entry %q: no whiteout at %q; entries %v", e.name, p, entries)
				}
			}
		}

		var out bytes.Buffer
		if err := Export(ctx, &out, diff, ExportOptions{Whiteouts: format}); err != nil {
			t.Fatalf("Export of an applied layer: %v", err)
		}
		exported := tarOverlayForm(t, out.Bytes())
		equalLists(t, "exported whiteouts", exported.whiteouts, got.whiteouts)
		equalLists(t, "exported opaque markers", exported.opaque, got.opaque)

		again := filepath.Join(base, "again")
		mkdirs(t, again)
		if _, err := Apply(ctx, again, bytes.NewReader(out.Bytes()), ApplyOptions{Whiteouts: format}); err != nil {
			t.Fatalf("Apply of the exported layer: %v", err)
		}
		equalLists(t, "tree after export and apply", fullTree(t, again), fullTree(t, diff))

		if format != OverlayUserWhiteouts || len(got.whiteouts) == 0 {
			return
		}
		// The xattr form of a whiteout must export as the device form does.
		for _, w := range got.whiteouts {
			p := filepath.Join(again, w)
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			writeFile(t, p, "", 0o600)
			if err := os.Lchown(p, int(st.Uid), int(st.Gid)); err != nil {
				t.Fatal(err)
			}
			setXattr(t, p, "user.overlay.whiteout", "y")
		}
		var out2 bytes.Buffer
		if err := Export(ctx, &out2, again, ExportOptions{Whiteouts: format}); err != nil {
			t.Fatalf("Export of xattr whiteouts: %v", err)
		}
		xform := tarOverlayForm(t, out2.Bytes())
		equalLists(t, "exported xattr whiteouts", xform.whiteouts, got.whiteouts)
		equalLists(t, "opaque markers beside xattr whiteouts", xform.opaque, got.opaque)
	})
}
