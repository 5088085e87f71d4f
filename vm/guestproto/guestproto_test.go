package guestproto

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	stream := Tag + "start 6.1.192 #1\n" +
		Tag + "begin example.com/a\n" +
		"=== RUN   TestX\n--- PASS: TestX (0.00s)\nPASS\n" +
		Tag + "end example.com/a 0 0.125\n" +
		Tag + "begin example.com/b\n" +
		"partial line without newline" + Tag + "end example.com/b 1 2.000\n" +
		Tag + "kmsg\n[    1.000000] hello\n" + Tag + "kmsg-end\n" +
		Tag + "done\n"
	g, err := Parse(strings.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	if g.Kernel != "6.1.192 #1" || !g.Done {
		t.Errorf("kernel %q done %v", g.Kernel, g.Done)
	}
	if len(g.Binaries) != 2 {
		t.Fatalf("got %d binaries, want 2", len(g.Binaries))
	}
	a, b := g.Binaries[0], g.Binaries[1]
	if a.Pkg != "example.com/a" || !a.Ended || a.ExitCode != 0 || a.Seconds != 0.125 {
		t.Errorf("binary a = %+v", a)
	}
	if !strings.Contains(string(a.Output), "--- PASS: TestX") {
		t.Errorf("binary a output %q", a.Output)
	}
	if b.ExitCode != 1 || string(b.Output) != "partial line without newline" {
		t.Errorf("binary b = %+v", b)
	}
	if len(g.Kmsg) != 1 || g.Kmsg[0] != "[    1.000000] hello" {
		t.Errorf("kmsg = %q", g.Kmsg)
	}
}

func TestParseTruncated(t *testing.T) {
	g, err := Parse(strings.NewReader(Tag + "begin p\n=== RUN   TestY\n"))
	if err != nil {
		t.Fatal(err)
	}
	if g.Done || len(g.Binaries) != 1 || g.Binaries[0].Ended {
		t.Errorf("truncated stream parsed as %+v", g)
	}
}

func TestParseCRLF(t *testing.T) {
	g, err := Parse(strings.NewReader(Tag + "begin p\r\n--- PASS: TestZ (1.50s)\r\n" + Tag + "end p 0 1.5\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Binaries) != 1 || string(g.Binaries[0].Output) != "--- PASS: TestZ (1.50s)\n" {
		t.Errorf("CR LF not normalised: %+v", g.Binaries)
	}
}

// The guest's Writer and the host's Parse agree on every record.
func TestWriterParseRoundTrip(t *testing.T) {
	var b strings.Builder
	w := Writer{W: &b}
	w.Start("6.12.118 #1 SMP")
	w.Note("modules: virtio_console missing")
	w.Begin("example.com/a")
	b.WriteString("=== RUN   TestX\nno newline")
	w.BinaryNote("example.com/a: signal: killed")
	w.End("example.com/a", -1, 61.25)
	w.KmsgBegin()
	b.WriteString("[    1.000000] hello\n")
	w.KmsgEnd()
	w.Error(errors.New("read manifest: gone"))
	w.Done()
	g, err := Parse(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	want := &Run{
		Kernel: "6.12.118 #1 SMP",
		Binaries: []Binary{{
			Pkg: "example.com/a",
			// Each of the note and the end record ends the line first.
			Output:   []byte("=== RUN   TestX\nno newline\n\n"),
			ExitCode: -1,
			Seconds:  61.25,
			Ended:    true,
		}},
		Kmsg:  []string{"[    1.000000] hello"},
		Done:  true,
		Notes: []string{"modules: virtio_console missing", "example.com/a: signal: killed", "read manifest: gone"},
	}
	if !reflect.DeepEqual(g, want) {
		t.Errorf("parsed\n%+v\nwant\n%+v", g, want)
	}
}

func TestManifestRoundTrip(t *testing.T) {
	entries := []Entry{
		{Pkg: "example.com/tests/guest/a", Binary: "/a.test", Dir: "/src/tests/guest/a"},
		{Pkg: "example.com/tests/guest/b", Binary: "/b.test", Dir: "/src/tests/guest/b"},
	}
	got, err := ParseManifest(EncodeManifest(entries))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, entries) {
		t.Errorf("round trip gave %+v", got)
	}
	if _, err := ParseManifest("example.com/a\t/a.test\n"); err == nil {
		t.Error("a line of two fields was accepted")
	}
}

func TestModuleOrderRoundTrip(t *testing.T) {
	mods := []Module{{Name: "virtio", File: "000-virtio.ko"}, {Name: "overlay", File: "001-overlay.ko.xz"}}
	got, err := ParseModuleOrder(EncodeModuleOrder(mods))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, mods) {
		t.Errorf("round trip gave %+v", got)
	}
	for _, bad := range []string{"overlay\n", "\t001-overlay.ko\n", "x\t../etc/passwd\n"} {
		if _, err := ParseModuleOrder(bad); err == nil {
			t.Errorf("ParseModuleOrder(%q) accepted a malformed line", bad)
		}
	}
}
