package main

import (
	"flag"
	"io"
	"path/filepath"
	"testing"

	"github.com/ovlkit/ovlkit/vm/initramfs"
)

// -file is repeatable, makes the host path absolute, and refuses a guest
// path given twice and one that is not absolute.
func TestFileFlag(t *testing.T) {
	parse := func(args ...string) (options, error) {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var o options
		o.register(fs)
		return o, fs.Parse(args)
	}
	o, err := parse("-file", "bin/runc=/usr/local/bin/runc", "-file", "/tmp/prog=/prog")
	if err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs("bin/runc")
	if err != nil {
		t.Fatal(err)
	}
	want := []initramfs.File{{Host: abs, Guest: "/usr/local/bin/runc"}, {Host: "/tmp/prog", Guest: "/prog"}}
	if len(o.files) != len(want) || o.files[0] != want[0] || o.files[1] != want[1] {
		t.Errorf("files %+v, want %+v", o.files, want)
	}
	for _, args := range [][]string{
		{"-file", "a=/x", "-file", "b=/x"},
		{"-file", "a=x"},
		{"-file", "a"},
	} {
		if _, err := parse(args...); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}
