package graph

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ovlkit/ovlkit/ovl"
	"golang.org/x/sys/unix"
)

// featureCache is features.json: the probe result and the boot it belongs
// to. The probe mounts a dozen test overlays; doing it once per boot rather
// than once per command keeps the CLI fast, and a reboot (possibly into
// another kernel) probes again.
type featureCache struct {
	Version  int          `json:"version"`
	BootID   string       `json:"boot_id"`
	Features ovl.Features `json:"features"`
}

// probeVersion changes when the probe learns something new, so that a
// cache written by an older probe is not read as "feature missing".
const probeVersion = 2

// bootID names the running boot: the kernel's boot id where sysctl is
// built in, otherwise the kernel build and the boot time from /proc/stat,
// which minimal kernels always have.
func bootID() (string, error) {
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return "", fmt.Errorf("read boot time: %w", err)
	}
	btime := ""
	for _, line := range strings.Split(string(stat), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			btime = strings.TrimSpace(v)
		}
	}
	if btime == "" {
		return "", fmt.Errorf("no btime in /proc/stat")
	}
	return unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Version[:]) + " " + btime, nil
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
		if json.Unmarshal(b, &c) == nil && c.BootID == boot && c.Version == probeVersion {
			return c.Features, nil
		}
	}
	f, err := ovl.Probe(filepath.Join(home, "staging"))
	if err != nil {
		return ovl.Features{}, fmt.Errorf("probe kernel features: %w", err)
	}
	b, err := json.MarshalIndent(featureCache{Version: probeVersion, BootID: boot, Features: f}, "", "  ")
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
