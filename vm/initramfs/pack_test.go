package initramfs

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/u-root/mkuimage/cpio"
)

func TestNestedWorkspace(t *testing.T) {
	top := t.TempDir()
	for _, f := range []string{"go.mod", "bench/go.mod", "bench/go.work", "other/go.mod"} {
		p := filepath.Join(top, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(top, "bench", "cmd", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		patterns []string
		want     string
		err      bool
	}{
		{[]string{"./tests/guest/..."}, "", false},
		{[]string{"./bench"}, filepath.Join(top, "bench", "go.work"), false},
		{[]string{"./bench/..."}, filepath.Join(top, "bench", "go.work"), false},
		{[]string{"./bench/cmd/x", "./tests/guest/graph"}, filepath.Join(top, "bench", "go.work"), false},
		{[]string{"./other"}, "", true},
	} {
		got, err := NestedWorkspace(top, c.patterns)
		if got != c.want || (err != nil) != c.err {
			t.Errorf("%v: %q, %v; want %q, error %v", c.patterns, got, err, c.want, c.err)
		}
	}
}

func TestParseFile(t *testing.T) {
	for _, c := range []struct {
		in   string
		want File
		err  bool
	}{
		{"build/runc=/usr/local/bin/runc", File{Host: "build/runc", Guest: "/usr/local/bin/runc"}, false},
		{"/a/b=/x", File{Host: "/a/b", Guest: "/x"}, false},
		{"runc", File{}, true},
		{"=/usr/bin/runc", File{}, true},
		{"runc=", File{}, true},
		{"runc=usr/bin/runc", File{}, true},
		{"runc=/usr/bin/../runc", File{}, true},
		{"runc=/usr/bin/", File{}, true},
		{"runc=/", File{}, true},
		{"runc=/ovlkit", File{}, true},
		{"runc=/ovlkit/bin/runc", File{}, true},
	} {
		got, err := ParseFile(c.in)
		if got != c.want || (err != nil) != c.err {
			t.Errorf("ParseFile(%q) = %+v, %v; want %+v, error %v", c.in, got, err, c.want, c.err)
		}
	}
}

// The tests archive carries the extra files at their guest paths, with
// their content and permissions, and directories for their parents.
func TestWriteTestsCPIOFiles(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "test.bin")
	prog := filepath.Join(dir, "prog")
	data := filepath.Join(dir, "data")
	for _, f := range []struct {
		path, body string
		mode       os.FileMode
	}{{bin, "test binary", 0o755}, {prog, "program", 0o750}, {data, "data", 0o600}} {
		if err := os.WriteFile(f.path, []byte(f.body), f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f.path, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	pkgs := []Package{{ImportPath: "example.com/p", Binary: bin, Dir: dir}}
	files := []File{{Host: prog, Guest: "/usr/local/bin/prog"}, {Host: data, Guest: "/data"}}
	var buf bytes.Buffer
	if err := writeTestsCPIO(&buf, pkgs, files); err != nil {
		t.Fatal(err)
	}
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(bytes.NewReader(buf.Bytes())))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range recs {
		body := ""
		if r.FileSize > 0 {
			b, err := io.ReadAll(io.NewSectionReader(r.ReaderAt, 0, int64(r.FileSize)))
			if err != nil {
				t.Fatal(err)
			}
			body = " " + string(b)
		}
		got[r.Name] = fmt.Sprintf("%o%s", r.Mode, body)
	}
	for name, want := range map[string]string{
		"usr":                 "40755",
		"usr/local":           "40755",
		"usr/local/bin":       "40755",
		"usr/local/bin/prog":  "100750 program",
		"data":                "100600 data",
		"ovlkit/bin/test.bin": "100755 test binary",
	} {
		if got[name] != want {
			t.Errorf("%s: %q, want %q", name, got[name], want)
		}
	}

	if err := writeTestsCPIO(io.Discard, pkgs, []File{{Host: filepath.Join(dir, "missing"), Guest: "/m"}}); err == nil {
		t.Error("a missing extra file was packed")
	}
	if err := writeTestsCPIO(io.Discard, pkgs, []File{{Host: dir, Guest: "/d"}}); err == nil {
		t.Error("a directory was packed as an extra file")
	}
}
