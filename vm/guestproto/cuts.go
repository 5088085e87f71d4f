package guestproto

// The hard cuts' protocol (vm/cuts.go on the host, tests/guest/cuts in
// the guest): one line per record on the virtio-serial port CutPort, a
// record's JSON after its name and filesystem.

// CutPort is the name of the virtio-serial port of the cut protocol; the
// guest finds it under /sys/class/virtio-ports by this name.
const CutPort = "ovlkit.cuts"

// CutStart is the first thing the host tells each boot.
type CutStart struct {
	Boot int    `json:"boot"`
	Seed uint64 `json:"seed"`
	// Run: run the workload after the check (every boot but the last).
	Run bool `json:"run"`
}

// CutAck is one acknowledged store operation.
type CutAck struct {
	// Op is init (the store was created), create, apply, write (a file
	// written and fsynced through a container layer's mount and the
	// layer put) or remove.
	Op     string `json:"op"`
	ID     string `json:"id,omitempty"`
	Parent string `json:"parent,omitempty"`
	RW     bool   `json:"rw,omitempty"`
	// Files: for apply, the layer's regular files and symlinks (path to
	// sha256, or "-> target"); for write, the one file written.
	Files map[string]string `json:"files,omitempty"`
}

// CutReport is what the guest found on one filesystem after a cut: the
// filesystem mounted (its journal replayed), the store opened (its
// recovery run), checked, verified, read back, cleaned up and closed.
type CutReport struct {
	FS string `json:"fs"`
	// Store: a store was found and opened. OpenError says why not when
	// a store directory exists but Open failed.
	Store     bool   `json:"store"`
	OpenError string `json:"open_error,omitempty"`
	// MountMillis is how long the mount (and so the journal or log
	// recovery) took.
	MountMillis int64 `json:"mount_ms"`
	// Problems are Check's findings after Open.
	Problems []string `json:"problems,omitempty"`
	// Staging lists what Open's recovery left in staging/.
	Staging []string `json:"staging,omitempty"`
	// Mounts lists mounts left under the store after Cleanup.
	Mounts []string `json:"mounts,omitempty"`
	// Errors are the guest's failures to look (a Diff that failed, say).
	Errors []string   `json:"errors,omitempty"`
	Layers []CutLayer `json:"layers,omitempty"`
}

// CutLayer is one layer as the guest found it.
type CutLayer struct {
	ID     string `json:"id"`
	Parent string `json:"parent,omitempty"`
	RW     bool   `json:"rw,omitempty"`
	// State is Verify's verdict (ok, empty, changed, damaged, ...).
	State  string   `json:"state"`
	Damage []string `json:"damage,omitempty"`
	// Files are the layer's own regular files and symlinks as its Diff
	// shows them (path to sha256, or "-> target").
	Files map[string]string `json:"files,omitempty"`
	// Bad: an applied image layer whose content is not the one the
	// workload makes for its ID.
	Bad []string `json:"bad,omitempty"`
}
