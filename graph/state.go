package graph

import (
	"encoding/json"
	"fmt"
	"sort"
	"time"
)

// stateVersion is bumped when the state file changes incompatibly.
const stateVersion = 1

// state is the store's single source of truth. A layer exists exactly when
// it has a record here; directories without a record are leftovers of an
// interrupted operation and are removed when the store is opened.
type state struct {
	Version int    `json:"version"`
	Layout  Layout `json:"layout"`
	// Userxattr stores overlay metadata as user.overlay.* and mounts
	// with userxattr; fixed when the store is created, like the layout.
	Userxattr bool                    `json:"userxattr,omitempty"`
	Created   time.Time               `json:"created"`
	Layers    map[string]*layerRecord `json:"layers"`
}

// layerRecord is what the store remembers about one layer.
type layerRecord struct {
	Parent string `json:"parent,omitempty"`
	// RW marks a container layer (CreateReadWrite).
	RW bool `json:"rw,omitempty"`
	// Link is the short name of the layer's diff under l/.
	Link string `json:"link"`
	// Depth counts the layers of the chain, this one included.
	Depth int `json:"depth"`
	// Committed is set when the first child is created: from then on the
	// layer is mounted without an upper, because the kernel refuses (or
	// warns about) a lower that is another mount's upper (moby #39475).
	Committed bool `json:"committed,omitempty"`
	// Applied is set once ApplyDiff has filled the layer; Size is the
	// content size it reported.
	Applied bool  `json:"applied,omitempty"`
	Size    int64 `json:"size,omitempty"`
	// Written is set when the layer was mounted read-write after
	// ApplyDiff: its content may differ from Size from then on.
	Written bool `json:"written,omitempty"`
	// Manifest says the layer directory holds a manifest of what the
	// layer was published with (see manifest.go): set by Create (an
	// empty one) and ApplyDiff. Layers of stores from before manifests
	// have none, which Verify reports as such, not as damage.
	Manifest bool `json:"manifest,omitempty"`
	// NeedsApply is set by Repair on a layer whose content it reset: the
	// layer is empty until ApplyDiff fills it again, which it may even
	// with children, and it and its descendants cannot be mounted,
	// diffed or built upon until then.
	NeedsApply bool      `json:"needs_apply,omitempty"`
	Created    time.Time `json:"created"`
	// Holds are the mounts callers make themselves from a MountSpec
	// (Acquire, View), by holder name. They are in the state, not in
	// the layer directory like the mount count, because the store
	// cannot check them against the kernel: the mount may be in
	// another process or namespace, so a hold lasts until Release.
	Holds map[string]Hold `json:"holds,omitempty"`
	// The mount count is not here but in the layer directory (see
	// mountRecord), so that Get and Put do not rewrite the state.
}

// Hold is one caller-made mount of a layer.
type Hold struct {
	// RW: the caller mounts the layer writable (Acquire of a layer that
	// is not committed); otherwise read-only.
	RW    bool      `json:"rw,omitempty"`
	Since time.Time `json:"since"`
}

// rwHolder returns a holder other than except that mounts r writable, or "".
func (r *layerRecord) rwHolder(except string) string {
	for _, h := range sortedHolders(r.Holds) {
		if h != except && r.Holds[h].RW {
			return h
		}
	}
	return ""
}

// sortedHolders lists the names of holds in order.
func sortedHolders(h map[string]Hold) []string {
	out := make([]string, 0, len(h))
	for n := range h {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func newState(layout Layout, now time.Time) *state {
	return &state{Version: stateVersion, Layout: layout, Created: now, Layers: map[string]*layerRecord{}}
}

// decodeState parses and validates a state file.
func decodeState(b []byte) (*state, error) {
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("parse state: %w", err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("state version %d, this build reads %d", st.Version, stateVersion)
	}
	if err := st.Layout.Valid(); err != nil {
		return nil, err
	}
	if st.Layers == nil {
		st.Layers = map[string]*layerRecord{}
	}
	for id, r := range st.Layers {
		if r == nil {
			return nil, fmt.Errorf("state: layer %q has no record", id)
		}
		if err := validID(id); err != nil {
			return nil, fmt.Errorf("state: %w", err)
		}
	}
	return &st, nil
}

// children returns the IDs whose parent is id, sorted.
func (st *state) children(id string) []string {
	var out []string
	for cid, r := range st.Layers {
		if r.Parent == id {
			out = append(out, cid)
		}
	}
	sort.Strings(out)
	return out
}

// chain returns id and its ancestors, id first. It fails on a missing
// parent or a cycle, which only a damaged state file can contain.
func (st *state) chain(id string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for cur := id; cur != ""; {
		if seen[cur] {
			return nil, fmt.Errorf("layer %s: parent cycle at %s", id, cur)
		}
		seen[cur] = true
		r, ok := st.Layers[cur]
		if !ok {
			return nil, fmt.Errorf("layer %s: ancestor %s: %w", id, cur, ErrNotExist)
		}
		out = append(out, cur)
		cur = r.Parent
	}
	return out, nil
}

// descendants returns id's children, their children and so on, sorted.
func (st *state) descendants(id string) []string {
	var out []string
	seen := map[string]bool{id: true}
	for next := []string{id}; len(next) > 0; {
		var more []string
		for _, p := range next {
			for _, c := range st.children(p) {
				if !seen[c] {
					seen[c] = true
					more = append(more, c)
				}
			}
		}
		out = append(out, more...)
		next = more
	}
	sort.Strings(out)
	return out
}

// needsApply returns the first layer of id's chain (id first) that
// Repair reset and that waits for its tar, or "".
func (st *state) needsApply(id string) string {
	seen := map[string]bool{}
	for cur := id; cur != "" && !seen[cur]; {
		seen[cur] = true
		r, ok := st.Layers[cur]
		if !ok {
			return ""
		}
		if r.NeedsApply {
			return cur
		}
		cur = r.Parent
	}
	return ""
}

func (st *state) linkInUse(link string) bool {
	for _, r := range st.Layers {
		if r.Link == link {
			return true
		}
	}
	return false
}
