package vm

import (
	"testing"
)

func TestParseTSCkHz(t *testing.T) {
	vmHost := "processor\t: 0\ncpu MHz\t\t: 2596.134\nflags\t\t: fpu tsc constant_tsc nonstop_tsc tsc_known_freq hypervisor\n" +
		"processor\t: 1\ncpu MHz\t\t: 1200.000\nflags\t\t: fpu\n"
	if khz, ok := parseTSCkHz(vmHost); !ok || khz != 2596134 {
		t.Errorf("VM host: %d %v, want 2596134", khz, ok)
	}
	for name, info := range map[string]string{
		"scaling bare metal": "cpu MHz\t\t: 3400.000\nflags\t\t: tsc constant_tsc nonstop_tsc\n",
		"no frequency":       "flags\t\t: tsc constant_tsc tsc_known_freq hypervisor\n",
		"empty":              "",
	} {
		if khz, ok := parseTSCkHz(info); ok {
			t.Errorf("%s: %d kHz, want none", name, khz)
		}
	}
}
