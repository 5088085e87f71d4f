package main

import (
	"strings"
	"testing"
)

func TestCheckFindsDroppedSymbols(t *testing.T) {
	final, _, err := parse(strings.NewReader(`CONFIG_A=y
# CONFIG_B is not set
CONFIG_C="str"
CONFIG_E=y
`))
	if err != nil {
		t.Fatal(err)
	}
	want, order, err := parse(strings.NewReader(`CONFIG_A=y
CONFIG_B=y
CONFIG_C="str"
CONFIG_D=y
# CONFIG_E is not set
# CONFIG_F is not set
`))
	if err != nil {
		t.Fatal(err)
	}
	got := check(final, "frag", want, order)
	var syms []string
	for _, m := range got {
		syms = append(syms, m.symbol)
	}
	if strings.Join(syms, ",") != "CONFIG_B,CONFIG_D,CONFIG_E" {
		t.Errorf("mismatches %v, want CONFIG_B,CONFIG_D,CONFIG_E", syms)
	}
	if s := got[1].String(); !strings.Contains(s, "CONFIG_D requested y, final .config has not set") {
		t.Errorf("message %q", s)
	}
}

func TestParseRejectsMalformed(t *testing.T) {
	if _, _, err := parse(strings.NewReader("CONFIG_X\n")); err == nil {
		t.Error("a CONFIG_ line without = parsed")
	}
}
