package graph

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ovlkit/ovlkit/layer"
	"golang.org/x/sys/unix"
)

// LayerState is what Verify finds a layer to be.
type LayerState string

// Layer states, in the order Verify decides them: the first that applies
// is the state.
const (
	// StateDamaged: the layer does not hold what it was published with,
	// or lacks something it needs; Report.Damage says what.
	StateDamaged LayerState = "damaged"
	// StateNeedsApply: Repair reset the layer; its content is absent
	// until ApplyDiff is given its tar again, and it and its children
	// cannot be mounted, diffed or built upon until then.
	StateNeedsApply LayerState = "needs-apply"
	// StateEmpty: created and never applied; only its structure is
	// checked (a container layer's content is its own).
	StateEmpty LayerState = "empty"
	// StateChanged: mounted read-write after ApplyDiff, so its content
	// is the container's, not the tar's; only its structure is checked.
	StateChanged LayerState = "changed"
	// StateNoManifest: applied by a store from before manifests; only
	// its structure is checked. Not damage.
	StateNoManifest LayerState = "no-manifest"
	// StateOK: the content is exactly what its manifest lists.
	StateOK LayerState = "ok"
)

// DamageKind classifies a Damage.
type DamageKind string

// Kinds of damage. DamageLink, DamageRecord and a missing work/ are
// derivable: Repair makes them again. The others lose content, and Repair
// resets the layer for its tar to be applied again.
const (
	DamageMissing    DamageKind = "missing"    // an entry of the manifest is gone
	DamageUnexpected DamageKind = "unexpected" // an entry the manifest does not list
	DamageType       DamageKind = "type"       // an entry of another type
	DamageContent    DamageKind = "content"    // a regular file's size or data
	DamageMetadata   DamageKind = "metadata"   // mode, owner, xattrs, link target, device
	DamageManifest   DamageKind = "manifest"   // the manifest is missing or unreadable
	DamageStructure  DamageKind = "structure"  // a directory of the layer is missing
	DamageLink       DamageKind = "link"       // the short link under l/
	DamageRecord     DamageKind = "record"     // a field of the state record
)

// Damage is one thing Verify found wrong with a layer.
type Damage struct {
	Kind DamageKind `json:"kind"`
	// Path is the entry inside the layer ("/etc/passwd"), when the
	// damage is to one.
	Path string `json:"path,omitempty"`
	What string `json:"what"`
	// Derivable: Repair rebuilds it in place. Otherwise the content is
	// lost, and Repair resets the layer to StateNeedsApply.
	Derivable bool `json:"derivable"`
}

func (d Damage) String() string { return prefixed(d.Path, d.What) }

// Report is what Verify found about one layer.
type Report struct {
	Layer string     `json:"layer"`
	State LayerState `json:"state"`
	// Entries is the number of records of the layer's manifest.
	Entries int      `json:"entries"`
	Damage  []Damage `json:"damage,omitempty"`
}

// Derivable reports whether Repair can fix every damage in place.
func (r Report) Derivable() bool {
	for _, d := range r.Damage {
		if !d.Derivable {
			return false
		}
	}
	return true
}

// ErrNeedsApply marks a layer, or an ancestor of one, that Repair reset:
// it has no content until its tar is applied again.
var ErrNeedsApply = errors.New("layer was reset by repair and needs its tar applied again")

// Verify compares layer id with the manifest it was published with and
// checks what the store derives from its record (directories, short
// link, depth). It changes nothing. A damaged layer gives a Report in
// StateDamaged, not an error; the error is for a Verify that could not
// look.
func (s *Store) Verify(ctx context.Context, id string) (Report, error) {
	if err := validID(id); err != nil {
		return Report{}, err
	}
	l, err := s.lockLayerHow(ctx, id, unix.LOCK_SH)
	switch {
	case errors.Is(err, ErrNotExist):
		// No directory to lock: a layer without a record, or one
		// whose directory is gone, which verify reports.
	case err != nil:
		return Report{}, fmt.Errorf("verify: %w", err)
	default:
		defer l.unlock()
	}
	return s.verifyLocked(ctx, id)
}

// VerifyAll verifies every layer, parents before children.
func (s *Store) VerifyAll(ctx context.Context) ([]Report, error) {
	ls, err := s.Layers()
	if err != nil {
		return nil, err
	}
	out := make([]Report, 0, len(ls))
	for _, li := range ls {
		r, err := s.Verify(ctx, li.ID)
		if errors.Is(err, ErrNotExist) {
			continue // removed meanwhile
		}
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// verifyLocked is Verify for a caller that holds the layer's lock, if it
// has a directory.
func (s *Store) verifyLocked(ctx context.Context, id string) (Report, error) {
	v := &verification{s: s, rep: Report{Layer: id}}
	depth, children, err := v.readRecord(ctx, id)
	if err != nil {
		return v.rep, err
	}
	v.checkRecord(depth, children)
	if !v.checkStructure() {
		return s.finishReport(v.rep, &v.rec), nil
	}
	if err := v.checkContent(ctx); err != nil {
		return v.rep, fmt.Errorf("verify %s: %w", id, err)
	}
	return s.finishReport(v.rep, &v.rec), nil
}

// A verification is the check of one layer against its record and its
// manifest, as it goes.
type verification struct {
	s      *Store
	rep    Report
	rec    layerRecord
	diffOK bool // diff/ is there
}

func (v *verification) add(kind DamageKind, path string, derivable bool, f string, a ...any) {
	v.rep.Damage = append(v.rep.Damage, Damage{Kind: kind, Path: path, What: fmt.Sprintf(f, a...), Derivable: derivable})
}

// readRecord copies the layer's record, and returns the depth its chain
// gives it (0 for a broken chain, which Check reports) and whether it has
// children.
func (v *verification) readRecord(ctx context.Context, id string) (depth int, children bool, err error) {
	err = v.s.view(ctx, func(st *state) error {
		r, ok := st.Layers[id]
		if !ok {
			return fmt.Errorf("verify %s: %w", id, ErrNotExist)
		}
		v.rec = *r
		if chain, err := st.chain(id); err == nil {
			depth = len(chain)
		}
		children = len(st.children(id)) > 0
		return nil
	})
	return depth, children, err
}

// checkRecord compares the record with what the state derives, and the
// short link with the layer.
func (v *verification) checkRecord(depth int, children bool) {
	rec, id := &v.rec, v.rep.Layer
	if depth != 0 && rec.Depth != depth {
		v.add(DamageRecord, "", true, "recorded depth %d, its chain makes it %d", rec.Depth, depth)
	}
	if children && !rec.Committed {
		v.add(DamageRecord, "", true, "has children but is not marked committed")
	}
	want := filepath.Join("..", "layers", id, "diff")
	if got, err := os.Readlink(v.s.linkPath(rec.Link)); err != nil {
		v.add(DamageLink, "", true, "short link l/%s is missing (%v)", rec.Link, errors.Unwrap(err))
	} else if got != want {
		v.add(DamageLink, "", true, "short link l/%s points to %q, not %q", rec.Link, got, want)
	}
}

// checkStructure checks the layer's directories; false when the layer
// directory itself is gone and there is nothing more to check.
func (v *verification) checkStructure() bool {
	s, id := v.s, v.rep.Layer
	if !isDir(s.layerDir(id)) {
		v.add(DamageStructure, "", false, "layer directory layers/%s is missing", id)
		return false
	}
	v.diffOK = isDir(s.diffDir(id))
	if !v.diffOK {
		v.add(DamageStructure, "", false, "diff/ is missing: the layer's content is gone")
	}
	if !isDir(s.workDir(id)) {
		v.add(DamageStructure, "", true, "work/ is missing")
	}
	if s.layout.ownTree(&v.rec) && !isDir(s.rootDir(id)) {
		v.add(DamageStructure, "", false, "root/ (the layer's full tree) is missing")
	}
	return true
}

// checkContent compares the diff directory with the manifest.
func (v *verification) checkContent(ctx context.Context) error {
	rec, diff := &v.rec, v.s.diffDir(v.rep.Layer)
	var manifest []mentry
	manifestOK := false
	if rec.Manifest {
		var err error
		manifest, err = readManifest(v.s.layerDir(v.rep.Layer))
		switch {
		case err == nil:
			manifestOK = true
			v.rep.Entries = len(manifest)
		case errors.Is(err, errManifest):
			// What the manifest recorded is derivable only when the
			// layer has no applied content for it to describe.
			derivable := !rec.Applied || rec.Written || rec.NeedsApply
			v.add(DamageManifest, "", derivable, "%v", err)
		default:
			return err
		}
	}
	if manifestOK && (!rec.Applied || rec.NeedsApply) && len(manifest) > 0 {
		v.add(DamageManifest, "", false, "an unapplied layer's manifest lists %d entries", len(manifest))
	}
	if v.diffOK && manifestOK && rec.Applied && !rec.Written && !rec.NeedsApply {
		dmg, err := compareTree(ctx, diff, manifest)
		if err != nil {
			return err
		}
		v.rep.Damage = append(v.rep.Damage, dmg...)
	}
	if v.diffOK && rec.NeedsApply {
		// Nothing can mount a reset layer, so nothing writes to it.
		if empty, err := dirEmpty(diff); err == nil && !empty {
			v.add(DamageUnexpected, "", false, "the layer was reset for its tar but holds content")
		}
	}
	return nil
}

// finishReport decides the layer's state.
func (s *Store) finishReport(rep Report, rec *layerRecord) Report {
	switch {
	case len(rep.Damage) > 0:
		rep.State = StateDamaged
	case rec.NeedsApply:
		rep.State = StateNeedsApply
	case !rec.Applied:
		rep.State = StateEmpty
	case rec.Written:
		rep.State = StateChanged
	case !rec.Manifest:
		rep.State = StateNoManifest
	default:
		rep.State = StateOK
	}
	return rep
}

func isDir(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.IsDir()
}

// compareTree compares the tree at diff with its manifest. Regular files
// whose size and metadata match are read and hashed.
func compareTree(ctx context.Context, diff string, want []mentry) ([]Damage, error) {
	got, _, err := scanTree(ctx, diff)
	if err != nil {
		return nil, err
	}
	var out []Damage
	add := func(kind DamageKind, path, f string, a ...any) {
		out = append(out, Damage{Kind: kind, Path: path, What: fmt.Sprintf(f, a...)})
	}
	i, j := 0, 0
	for i < len(want) || j < len(got) {
		switch {
		case j == len(got) || (i < len(want) && want[i].Path < got[j].Path):
			w := &want[i]
			add(DamageMissing, w.Path, "missing (the manifest lists a %s)", recordSummary(w))
			i++
		case i == len(want) || got[j].Path < want[i].Path:
			g := &got[j]
			add(DamageUnexpected, g.Path, "not in the manifest (a %s)", recordSummary(g))
			j++
		default:
			dmg, err := compareEntry(ctx, diff, &want[i], &got[j])
			if err != nil {
				return nil, err
			}
			out = append(out, dmg...)
			i++
			j++
		}
	}
	return out, nil
}

// recordSummary describes an entry in a few words for messages.
func recordSummary(e *mentry) string {
	switch e.Type {
	case mFile:
		return fmt.Sprintf("regular file of %d bytes", e.Size)
	case mHardlink:
		return "hard link to " + e.Target
	case mSymlink:
		return fmt.Sprintf("symlink to %q", e.Target)
	}
	return e.describe()
}

// compareEntry compares one entry of the tree with its record.
func compareEntry(ctx context.Context, diff string, w, g *mentry) ([]Damage, error) {
	var out []Damage
	add := func(kind DamageKind, f string, a ...any) {
		out = append(out, Damage{Kind: kind, Path: w.Path, What: fmt.Sprintf(f, a...)})
	}
	if w.Type != g.Type || (w.Type == mChar && (w.Major == 0 && w.Minor == 0) != (g.Major == 0 && g.Minor == 0)) {
		switch {
		case w.Type == mHardlink:
			add(DamageType, "no longer the same file as %s: a separate %s", w.Target, recordSummary(g))
		case g.Type == mHardlink:
			add(DamageType, "now the same file as %s, the manifest lists a separate %s", g.Target, recordSummary(w))
		default:
			add(DamageType, "a %s, the manifest lists a %s", recordSummary(g), recordSummary(w))
		}
		return out, nil
	}
	if w.Type == mHardlink {
		if w.Target != g.Target {
			add(DamageType, "the same file as %s, the manifest says as %s", g.Target, w.Target)
		}
		return out, nil
	}
	if w.Mode != g.Mode {
		add(DamageMetadata, "mode %04o, the manifest says %04o", g.Mode, w.Mode)
	}
	if w.UID != g.UID || w.GID != g.GID {
		add(DamageMetadata, "owner %d:%d, the manifest says %d:%d", g.UID, g.GID, w.UID, w.GID)
	}
	switch w.Type {
	case mSymlink:
		if w.Target != g.Target {
			add(DamageMetadata, "symlink to %q, the manifest says %q", g.Target, w.Target)
		}
	case mChar, mBlock:
		if w.Major != g.Major || w.Minor != g.Minor {
			add(DamageMetadata, "device %d:%d, the manifest says %d:%d", g.Major, g.Minor, w.Major, w.Minor)
		}
	}
	out = append(out, compareXattrs(w, g)...)
	if w.Type != mFile {
		return out, nil
	}
	switch {
	case g.Size == 0 && w.Size > 0:
		add(DamageContent, "truncated to 0 bytes, the manifest says %d", w.Size)
		return out, nil
	case g.Size != w.Size:
		add(DamageContent, "%d bytes, the manifest says %d", g.Size, w.Size)
		return out, nil
	}
	algo, _, _ := strings.Cut(w.Digest, ":")
	sum, zeros, err := fileDigest(ctx, filepath.Join(diff, filepath.FromSlash(w.Path)), layer.DigestAlgo(algo))
	if err != nil {
		return nil, err
	}
	if sum != w.Digest {
		if zeros && w.Size > 0 {
			add(DamageContent, "zero-filled: all %d bytes are zeros, the manifest's data is %s", w.Size, w.Digest)
		} else {
			add(DamageContent, "content differs: %s, the manifest says %s", sum, w.Digest)
		}
	}
	return out, nil
}

func compareXattrs(w, g *mentry) []Damage {
	var out []Damage
	add := func(f string, a ...any) {
		out = append(out, Damage{Kind: DamageMetadata, Path: w.Path, What: fmt.Sprintf(f, a...)})
	}
	have := map[string][]byte{}
	for _, x := range g.Xattrs {
		have[x.Name] = x.Value
	}
	for _, x := range w.Xattrs {
		v, ok := have[x.Name]
		switch {
		case !ok:
			add("xattr %s is missing", x.Name)
		case !bytes.Equal(v, x.Value):
			add("xattr %s is %q, the manifest says %q", x.Name, v, x.Value)
		}
		delete(have, x.Name)
	}
	extra := make([]string, 0, len(have))
	for n := range have {
		extra = append(extra, n)
	}
	sort.Strings(extra)
	for _, n := range extra {
		add("xattr %s is not in the manifest", n)
	}
	return out
}
