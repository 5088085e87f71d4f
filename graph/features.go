package graph

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ovlkit/ovlkit/ovl"
)

// featureCache is features.json: the probe result and the boot it belongs
// to. The probe mounts a dozen test overlays; doing it once per boot rather
// than once per command keeps the CLI fast, and a reboot (possibly into
// another kernel) probes again.
type featureCache struct {
	BootID   string       `json:"boot_id"`
	Features ovl.Features `json:"features"`
}

func bootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("read boot id: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// loadFeatures returns this boot's probe result for home, probing when
// there is none. The caller holds the store lock, so the probe's scratch
// directory in staging/ is not removed under it by another process.
func loadFeatures(home string) (ovl.Features, error) {
	path := filepath.Join(home, "features.json")
	boot, err := bootID()
	if err != nil {
		return ovl.Features{}, err
	}
	if b, err := os.ReadFile(path); err == nil {
		var c featureCache
		if json.Unmarshal(b, &c) == nil && c.BootID == boot {
			return c.Features, nil
		}
	}
	f, err := ovl.Probe(filepath.Join(home, "staging"))
	if err != nil {
		return ovl.Features{}, fmt.Errorf("probe kernel features: %w", err)
	}
	b, err := json.MarshalIndent(featureCache{BootID: boot, Features: f}, "", "  ")
	if err != nil {
		return ovl.Features{}, fmt.Errorf("encode features: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return ovl.Features{}, fmt.Errorf("write features: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return ovl.Features{}, fmt.Errorf("write features: %w", err)
	}
	return f, nil
}
