package vm

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/ovlkit/ovlkit/vm/guestproto"
)

// The records of the hard-cut protocol (tests/guest/cuts speaks the guest
// side; keep the two in sync). The guest acknowledges each store
// operation after it returned; the host counts as acknowledged exactly
// what reached it before it killed the VM, as a client only knows what it
// was told. After the next boot the guest reports what the store holds,
// and the host judges that against what was acknowledged.

// cutModel is what one filesystem's store must hold: everything
// acknowledged, and nothing whose removal was acknowledged.
type cutModel struct {
	store   bool
	layers  map[string]*modelLayer
	removed map[string]bool
	acked   int // operations acknowledged in all
	// underWay is the operation the guest announced and had not
	// acknowledged when the power went, if any: a remove of a layer
	// may have happened.
	underWay *guestproto.CutAck
}

type modelLayer struct {
	parent  string
	rw      bool
	applied map[string]string // nil until an apply was acknowledged
	writes  map[string]string
}

func newCutModel() *cutModel {
	return &cutModel{layers: map[string]*modelLayer{}, removed: map[string]bool{}}
}

// ack records an acknowledged operation; an ack that does not fit the
// model (an apply of a layer never created) is an error of the protocol.
func (m *cutModel) ack(a guestproto.CutAck) error {
	m.acked++
	switch a.Op {
	case "init":
		m.store = true
	case "create":
		if _, ok := m.layers[a.ID]; ok {
			return fmt.Errorf("create of %s acknowledged twice", a.ID)
		}
		m.layers[a.ID] = &modelLayer{parent: a.Parent, rw: a.RW, writes: map[string]string{}}
	case "apply", "write":
		l, ok := m.layers[a.ID]
		if !ok {
			return fmt.Errorf("%s of %s acknowledged, but the layer is not known", a.Op, a.ID)
		}
		if a.Op == "apply" {
			l.applied = copyFiles(a.Files)
		} else {
			for p, sum := range a.Files {
				l.writes[p] = sum
			}
		}
	case "remove":
		delete(m.layers, a.ID)
		m.removed[a.ID] = true
	default:
		return fmt.Errorf("unknown operation %q acknowledged", a.Op)
	}
	return nil
}

func copyFiles(f map[string]string) map[string]string {
	out := make(map[string]string, len(f))
	for k, v := range f {
		out[k] = v
	}
	return out
}

// judge compares what the guest found with what was acknowledged and
// returns every violated invariant, one sentence each:
//
//   - the store opens, and Check, staging/ and the mounts are clean;
//   - every layer is complete or absent: Verify finds it ok, empty or
//     changed, never damaged, and an applied image layer holds the
//     content the workload makes for its ID;
//   - nothing acknowledged is lost: every layer whose create was
//     acknowledged (and whose remove was not) is there on its parent,
//     with the content of an acknowledged apply and every acknowledged
//     write;
//   - nothing removed comes back (a layer whose remove was under way
//     may be there or not);
//   - at most one layer the model does not know: the one operation that
//     was under way when the power went.
func (m *cutModel) judge(r guestproto.CutReport) []string {
	var v []string
	add := func(f string, a ...any) { v = append(v, fmt.Sprintf(f, a...)) }
	if r.OpenError != "" {
		add("open: %s", r.OpenError)
	}
	if !r.Store {
		if m.store {
			add("the store's creation was acknowledged, but no store is there")
		}
		return append(v, r.Errors...)
	}
	for _, p := range r.Problems {
		add("check: %s", p)
	}
	for _, s := range r.Staging {
		add("left in staging/ after recovery: %s", s)
	}
	for _, s := range r.Mounts {
		add("mounted after Cleanup: %s", s)
	}
	for _, e := range r.Errors {
		add("guest: %s", e)
	}
	found := map[string]guestproto.CutLayer{}
	unknown := 0
	for _, l := range r.Layers {
		found[l.ID] = l
		switch l.State {
		case "ok", "empty", "changed":
		default:
			add("%s: not complete: verify says %s: %s", l.ID, l.State, strings.Join(l.Damage, "; "))
		}
		for _, b := range l.Bad {
			add("%s: %s", l.ID, b)
		}
		if m.removed[l.ID] {
			add("%s: its remove was acknowledged, but it is back", l.ID)
		}
		if _, ok := m.layers[l.ID]; !ok && !m.removed[l.ID] {
			unknown++
		}
	}
	if unknown > 1 {
		add("%d layers whose create was never acknowledged (one operation at most was under way)", unknown)
	}
	for _, id := range sortedNames(m.layers) {
		want := m.layers[id]
		got, ok := found[id]
		if !ok {
			if u := m.underWay; u == nil || u.Op != "remove" || u.ID != id {
				add("%s: its create was acknowledged, but it is gone", id)
			}
			continue
		}
		if got.Parent != want.parent || got.RW != want.rw {
			add("%s: parent %q rw=%v, acknowledged as parent %q rw=%v", id, got.Parent, got.RW, want.parent, want.rw)
		}
		if want.applied != nil {
			if got.State != "ok" {
				add("%s: its apply was acknowledged, but verify says %s", id, got.State)
			}
			if d := fileDiff(got.Files, want.applied); d != "" {
				add("%s: content differs from the acknowledged apply: %s", id, d)
			}
		}
		for _, p := range sortedNames(want.writes) {
			if sum, ok := got.Files[p]; !ok {
				add("%s: acknowledged write of %s is lost", id, p)
			} else if sum != want.writes[p] {
				add("%s: acknowledged write of %s reads back as %.12s, written as %.12s", id, p, sum, want.writes[p])
			}
		}
	}
	return v
}

// adopt makes the model what the guest found, once judged: what the
// operation under way at the cut left behind is known from then on.
func (m *cutModel) adopt(r guestproto.CutReport) {
	m.store = r.Store
	m.underWay = nil
	layers := map[string]*modelLayer{}
	for _, l := range r.Layers {
		ml := &modelLayer{parent: l.Parent, rw: l.RW, writes: map[string]string{}}
		if old, ok := m.layers[l.ID]; ok && old.applied != nil {
			ml.applied = old.applied
		} else if l.State == "ok" && !l.RW {
			ml.applied = copyFiles(l.Files)
		}
		if l.RW {
			ml.writes = copyFiles(l.Files)
		}
		layers[l.ID] = ml
	}
	for id := range m.layers {
		if _, ok := layers[id]; !ok {
			m.removed[id] = true
		}
	}
	m.layers = layers
}

// fileDiff says how got differs from want, or "".
func fileDiff(got, want map[string]string) string {
	var d []string
	for _, p := range sortedNames(want) {
		switch g, ok := got[p]; {
		case !ok:
			d = append(d, "missing "+p)
		case g != want[p]:
			d = append(d, "changed "+p)
		}
	}
	for _, p := range sortedNames(got) {
		if _, ok := want[p]; !ok {
			d = append(d, "extra "+p)
		}
	}
	return strings.Join(d, ", ")
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// parseCutLine splits a protocol line into its verb, filesystem (for
// the verbs that carry one) and JSON payload.
func parseCutLine(line string) (verb, fs, payload string) {
	verb, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
	switch verb {
	case "report", "ack", "op", "begin", "fail":
		fs, payload, _ = strings.Cut(rest, " ")
	default:
		payload = rest
	}
	return verb, fs, payload
}

func decodeAck(payload string) (guestproto.CutAck, error) {
	var a guestproto.CutAck
	if err := json.Unmarshal([]byte(payload), &a); err != nil {
		return a, fmt.Errorf("ack %q: %w", payload, err)
	}
	return a, nil
}
