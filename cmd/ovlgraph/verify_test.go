package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ovlkit/ovlkit/graph"
)

// TestCLIVerifyRepair: check --verify names a truncated file and exits 1,
// --repair resets the layer and exits 3 until the same tar is applied
// again, after which the store verifies clean; --json says the same.
func TestCLIVerifyRepair(t *testing.T) {
	home := filepath.Join(t.TempDir(), "store")
	layerTar := tarWith(t, "motd", "hello\n")
	for _, args := range [][]string{{"init"}, {"create", "base"}, {"apply", "base"}, {"create", "--parent", "base", "app"}} {
		if code, _, errs := runCLI(t, layerTar, append([]string{"--home", home}, args...)...); code != 0 {
			t.Fatalf("%v: %s", args, errs)
		}
	}
	code, out, errs := runCLI(t, "", "--home", home, "check", "--verify")
	if code != 0 || out != "base: ok (2 entries)\napp: empty\nstore: ok\n" {
		t.Fatalf("verify of a sound store: %d %q %q", code, out, errs)
	}
	if err := os.Truncate(filepath.Join(home, "layers", "base", "diff", "motd"), 0); err != nil {
		t.Fatal(err)
	}
	code, out, errs = runCLI(t, "", "--home", home, "check", "--verify")
	if code != 1 || !strings.Contains(out, "base: damaged\n  /motd: truncated to 0 bytes, the manifest says 6 [content; repair resets the layer]\n") ||
		!strings.Contains(errs, "1 damaged layer(s)") {
		t.Fatalf("verify of a truncated file: %d %q %q", code, out, errs)
	}
	code, out, errs = runCLI(t, "", "--home", home, "--json", "check", "--verify", "--repair")
	var res struct {
		OK      bool           `json:"ok"`
		Layers  []graph.Report `json:"layers"`
		Repairs []struct {
			Layer string           `json:"layer"`
			State graph.LayerState `json:"state"`
		} `json:"repairs"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 3 || res.OK || len(res.Repairs) != 1 ||
		res.Repairs[0].Layer != "base" || res.Repairs[0].State != graph.StateNeedsApply || len(res.Layers) != 2 {
		t.Fatalf("repair: %d %q %q (%v)", code, out, errs, err)
	}
	code, out, _ = runCLI(t, "", "--home", home, "check", "--verify", "base")
	if code != 3 || out != "base: needs-apply (apply its tar again)\nstore: ok\n" {
		t.Fatalf("verify of the reset layer: %d %q", code, out)
	}
	if code, out, _ = runCLI(t, "", "--home", home, "check"); code != 0 || out != "ok\n" {
		t.Fatalf("check after repair: %d %q", code, out)
	}
	if code, _, errs := runCLI(t, layerTar, "--home", home, "apply", "base"); code != 0 {
		t.Fatalf("apply again: %s", errs)
	}
	if code, out, _ = runCLI(t, "", "--home", home, "check", "--verify"); code != 0 || !strings.Contains(out, "base: ok") {
		t.Fatalf("verify after apply: %d %q", code, out)
	}
}
