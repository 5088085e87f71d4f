package experiments

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestQuantile(t *testing.T) {
	vs := []float64{5, 1, 4, 2, 3}
	for _, c := range []struct{ q, want float64 }{{0, 1}, {0.25, 2}, {0.5, 3}, {0.75, 4}, {1, 5}} {
		if got := Quantile(vs, c.q); got != c.want {
			t.Errorf("Quantile(%v, %g) = %g, want %g", vs, c.q, got, c.want)
		}
	}
	if got := Median([]float64{4, 1, 2, 10}); got != 3 {
		t.Errorf("median of an even count = %g, want 3 (interpolated)", got)
	}
	if vs[0] != 5 {
		t.Errorf("Quantile sorted its argument in place: %v", vs)
	}
	if !math.IsNaN(Median(nil)) || !math.IsNaN(Quantile(vs, 2)) {
		t.Errorf("no values or q out of range should be NaN")
	}
}

func TestSummarizeGroupsInOrder(t *testing.T) {
	recs := []Record{
		{Exp: "e", Case: "b", X: 1, Metric: "m", Unit: "ms", Rep: 0, Value: 10},
		{Exp: "e", Case: "a", X: 1, Metric: "m", Unit: "ms", Rep: 0, Value: 1},
		{Exp: "e", Case: "b", X: 1, Metric: "m", Unit: "ms", Rep: 1, Value: 30},
		{Exp: "e", Case: "b", X: 1, Metric: "m", Unit: "ms", Rep: 2, Value: 20},
		{Exp: "e", Case: "b", X: 2, Metric: "m", Unit: "ms", Rep: 0, Value: 7},
	}
	ss := Summarize(recs)
	if len(ss) != 3 {
		t.Fatalf("got %d summaries, want 3: %+v", len(ss), ss)
	}
	want := Summary{Exp: "e", Case: "b", X: 1, Metric: "m", Unit: "ms", N: 3, Median: 20, Min: 10, Max: 30, Q1: 15, Q3: 25}
	if ss[0] != want {
		t.Errorf("first summary %+v, want %+v", ss[0], want)
	}
	if ss[1].Case != "a" || ss[2].X != 2 {
		t.Errorf("order: %+v", ss)
	}
	if got := Cases(ss); strings.Join(got, ",") != "b,a" {
		t.Errorf("Cases = %v", got)
	}
	if got := Select(ss, "e", "m"); len(got) != 3 {
		t.Errorf("Select = %v", got)
	}
}

func TestRatiosPairRepetitions(t *testing.T) {
	recs := []Record{
		{Exp: "e", Case: "num", X: 1, Metric: "ms", Rep: 0, Value: 10},
		{Exp: "e", Case: "num", X: 1, Metric: "ms", Rep: 1, Value: 40},
		{Exp: "e", Case: "den", X: 1, Metric: "ms", Rep: 1, Value: 20},
		{Exp: "e", Case: "den", X: 1, Metric: "ms", Rep: 0, Value: 5},
		{Exp: "e", Case: "den", X: 2, Metric: "ms", Rep: 0, Value: 5},
	}
	got, err := Ratios(recs, "e", "ms", "num", "den")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Value != 2 || got[1].Value != 2 || got[0].Case != "num/den" || got[0].Unit != "x" {
		t.Errorf("ratios %+v, want two of 2 (paired by repetition)", got)
	}
	recs = append(recs, Record{Exp: "e", Case: "num", X: 3, Metric: "ms", Rep: 0, Value: 1})
	if _, err := Ratios(recs, "e", "ms", "num", "den"); err == nil {
		t.Errorf("a sample without partner was accepted")
	}
	if _, err := Ratios(recs, "e", "ms", "nobody", "den"); err == nil {
		t.Errorf("a case without samples was accepted")
	}
}

func TestEmitParseRoundTrip(t *testing.T) {
	var out bytes.Buffer
	r1 := Record{Exp: "copyup", Case: "overlay-xfs-auto", X: 4096, Metric: "ms", Unit: "ms", Rep: 3, Value: 1.5}
	if err := Emit(&out, r1); err != nil {
		t.Fatal(err)
	}
	if err := EmitEnv(&out, Env{"kernel": "6.1.0"}); err != nil {
		t.Fatal(err)
	}
	// As ovlvm -json stores it: test2json events, the record line split
	// over two events, interleaved with another test's output.
	line := out.String()
	cut := strings.Index(line, "\"case\"")
	var events bytes.Buffer
	enc := json.NewEncoder(&events)
	for _, ev := range []event{
		{Action: "run", Package: "p", Test: "BenchmarkA"},
		{Action: "output", Package: "p", Test: "BenchmarkA", Output: line[:cut]},
		{Action: "output", Package: "p", Test: "BenchmarkB", Output: "noise " + Prefix[:4] + "\n"},
		{Action: "output", Package: "p", Test: "BenchmarkA", Output: line[cut:]},
	} {
		if err := enc.Encode(ev); err != nil {
			t.Fatal(err)
		}
	}
	recs, env, err := Parse(&events)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0] != r1 {
		t.Errorf("records %+v, want [%+v]", recs, r1)
	}
	if env["kernel"] != "6.1.0" {
		t.Errorf("env %v", env)
	}
	// Plain output works too.
	recs, _, err = Parse(strings.NewReader("=== RUN x\n" + line))
	if err != nil || len(recs) != 1 {
		t.Errorf("plain output: %v, %v", recs, err)
	}
}

func TestParseRejectsBadRecords(t *testing.T) {
	for _, in := range []string{
		Prefix + "{not json\n",
		Prefix + `{"exp":"e","metric":"m"}` + "\n",
		EnvPrefix + "[1]\n",
	} {
		if _, _, err := Parse(strings.NewReader(in)); err == nil {
			t.Errorf("Parse(%q) accepted it", in)
		}
	}
}

func TestRSTTable(t *testing.T) {
	got, err := RSTTable([]string{"case", "ms"}, [][]string{{"overlay", "1.50"}, {"btrfs-snapshot", "12"}})
	if err != nil {
		t.Fatal(err)
	}
	want := "" +
		"==============  ====\n" +
		"case            ms\n" +
		"==============  ====\n" +
		"overlay         1.50\n" +
		"btrfs-snapshot  12\n" +
		"==============  ====\n"
	if got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
	if _, err := RSTTable([]string{"a", "b"}, [][]string{{"x"}}); err == nil {
		t.Errorf("a short row was accepted")
	}
	if _, err := RSTTable([]string{"a"}, [][]string{{""}}); err == nil {
		t.Errorf("an empty cell was accepted")
	}
}

func TestFormat(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{Num(1234.4), "1234"}, {Num(12.34), "12.3"}, {Num(1.234), "1.23"}, {Num(0.01234), "0.0123"},
		{Spread(Summary{N: 5, Median: 2, Min: 1, Max: 3}), "2.00 (1.00–3.00)"},
		{Spread(Summary{N: 5, Median: 2, Min: 2, Max: 2}), "2.00"},
		{Bytes(4096), "4 KiB"}, {Bytes(1462272), "1.395 MiB"}, {Bytes(64 << 20), "64 MiB"}, {Bytes(10), "10 B"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestMeminfo(t *testing.T) {
	m, err := Meminfo([]byte("MemTotal:        1000 kB\nCached:    20 kB\nHugePages_Total:       0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if m["MemTotal"] != 1000*1024 || m["Cached"] != 20*1024 || m["HugePages_Total"] != 0 {
		t.Errorf("meminfo %v", m)
	}
	for _, bad := range []string{"", "Cached 20 kB\n", "Cached: x kB\n", "Cached: 1 MB\n"} {
		if _, err := Meminfo([]byte(bad)); err == nil {
			t.Errorf("Meminfo(%q) accepted it", bad)
		}
	}
	// The host's own file parses and has the field the experiment reads.
	if _, err := Cached(); err != nil {
		t.Errorf("Cached: %v", err)
	}
}

func TestCopyTreeAndReadTree(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	x := Xorshift(7)
	if err := os.MkdirAll(filepath.Join(src, "a", "b"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := WriteRandomFile(filepath.Join(src, "a", "big"), 3<<20+5, &x); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a", "b", "small"), []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../big", filepath.Join(src, "a", "b", "link")); err != nil {
		t.Fatal(err)
	}
	// Special files take the Mknod path that overlay whiteouts (character
	// devices 0:0) take; a FIFO needs no privilege.
	if err := syscall.Mkfifo(filepath.Join(src, "a", "fifo"), 0o640); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "dst")
	if err := CopyTree(src, dst); err != nil {
		t.Fatal(err)
	}
	n, files, err := ReadTree(dst)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3<<20+10 || files != 2 {
		t.Errorf("read %d bytes in %d files, want %d in 2", n, files, 3<<20+10)
	}
	a, _ := os.ReadFile(filepath.Join(src, "a", "big"))
	b, _ := os.ReadFile(filepath.Join(dst, "a", "big"))
	if !bytes.Equal(a, b) {
		t.Errorf("copied content differs")
	}
	if l, err := os.Readlink(filepath.Join(dst, "a", "b", "link")); err != nil || l != "../big" {
		t.Errorf("symlink: %q, %v", l, err)
	}
	if st, err := os.Lstat(filepath.Join(dst, "a", "fifo")); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("fifo: %v, %v", st, err)
	}
	if st, err := os.Stat(filepath.Join(dst, "a")); err != nil || st.Mode().Perm() != 0o750 {
		t.Errorf("dir mode: %v, %v", st, err)
	}
	s1, s2 := statIno(t, filepath.Join(src, "a", "big")), statIno(t, filepath.Join(dst, "a", "big"))
	if s1 == s2 {
		t.Errorf("the copy shares the inode")
	}
	if err := CopyTree(src, dst); err == nil {
		t.Errorf("copying over an existing tree succeeded")
	}
}

func statIno(t *testing.T, p string) uint64 {
	t.Helper()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Ino
}

func TestResident(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	x := Xorshift(3)
	if err := WriteRandomFile(p, 1<<20, &x); err != nil {
		t.Fatal(err)
	}
	// Just written: every page is in the cache.
	res, pages, err := Resident(p)
	if err != nil {
		t.Fatal(err)
	}
	if pages != (1<<20)/os.Getpagesize() || res != pages {
		t.Errorf("resident %d of %d pages of a file just written, want all %d", res, pages, (1<<20)/os.Getpagesize())
	}
	empty := filepath.Join(t.TempDir(), "e")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if res, pages, err := Resident(empty); err != nil || res != 0 || pages != 0 {
		t.Errorf("empty file: %d/%d, %v", res, pages, err)
	}
	if _, _, err := Resident(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Errorf("a missing file gave no error")
	}
}

func TestInodesUsed(t *testing.T) {
	dir := t.TempDir()
	n, err := InodesUsed(dir)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Errorf("no inodes in use on the filesystem of %s", dir)
	}
	if _, err := InodesUsed(filepath.Join(dir, "missing")); err == nil {
		t.Errorf("a missing path gave no error")
	}
}
