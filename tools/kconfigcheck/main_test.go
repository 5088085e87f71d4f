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

func TestPresentListsSurvivors(t *testing.T) {
	final, _, err := parse(strings.NewReader("CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=17\n"))
	if err != nil {
		t.Fatal(err)
	}
	want, order, err := parse(strings.NewReader("CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=16\nCONFIG_D=y\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(present(final, "frag", want, order), "\n")
	if got != "frag: CONFIG_A=y present\nfrag: CONFIG_B=not set present" {
		t.Errorf("present:\n%s", got)
	}
}

func TestParseRejectsMalformed(t *testing.T) {
	if _, _, err := parse(strings.NewReader("CONFIG_X\n")); err == nil {
		t.Error("a CONFIG_ line without = parsed")
	}
}
