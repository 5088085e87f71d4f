package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ex "github.com/ovlkit/ovlkit/bench/experiments"
)

// synthetic emits the records a small run of all four experiments would,
// with values chosen so that medians and ratios are known.
func synthetic(t *testing.T, skip string) string {
	t.Helper()
	var out bytes.Buffer
	emit := func(exp, cs string, x float64, metric, unit string, rep int, v float64) {
		if cs == skip {
			return
		}
		if err := ex.Emit(&out, ex.Record{Exp: exp, Case: cs, X: x, Metric: metric, Unit: unit, Rep: rep, Value: v}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ex.EmitEnv(&out, ex.Env{"kernel": "6.1.0-ovlkit", "mem_total_mib": "1500"}); err != nil {
		t.Fatal(err)
	}
	for rep := 0; rep < 5; rep++ {
		k := float64(rep + 1) // each repetition slower than the one before
		for _, n := range []float64{1, 10} {
			for i, cs := range []string{"overlay-ext4", "overlay-xfs", "hardlink-ext4", "btrfs-snapshot", "copy-ext4", "overlay-bare-ext4"} {
				f := float64(i + 1)
				emit("createdestroy", cs, n, "create_ms", "ms", rep, 2*f*k)
				emit("createdestroy", cs, n, "destroy_ms", "ms", rep, f*k)
				emit("createdestroy", cs, n, "cycle_ms", "ms", rep, 3*f*k)
				emit("createdestroy", cs, n, "throughput", "containers/s", rep, 1000/(3*f*k))
			}
			for i, cs := range []string{"overlay-ext4", "btrfs-snapshot", "copy-ext4"} {
				growth := 20.0
				if i > 0 {
					growth *= n
				}
				emit("pagecache", cs, n, "cached_mib", "MiB", rep, growth+float64(rep)/10)
				emit("pagecache", cs, n, "cached_per_image", "x", rep, growth/20)
				emit("pagecache", cs, n, "origin_resident_pct", "%", rep, 100)
				emit("pagecache", cs, n, "container_resident_pct", "%", rep, 100)
			}
		}
		for _, size := range []float64{4096, 1 << 20} {
			for i, cs := range []string{"overlay-ext4-auto", "overlay-ext4-strict", "direct-ext4", "overlay-xfs-auto", "overlay-xfs-strict", "direct-xfs", "btrfs-snapshot"} {
				d := float64(i+1) * k
				emit("copyup", cs, size, "ms", "ms", rep, d)
				emit("copyup", cs, size, "mb_per_s", "MB/s", rep, size/1e6/(d/1000))
				if size == 4096 {
					emit("copyup", cs+"-tree", 100, "ms", "ms", rep, 10*d)
					emit("copyup", cs+"-tree", 100, "files_per_s", "files/s", rep, 100/(10*d/1000))
					if strings.HasPrefix(cs, "overlay") {
						emit("copyup", cs, 0, "copied_bytes", "", rep, 1<<20)
						emit("copyup", cs, 0, "cloned_bytes", "", rep, 0)
						emit("copyup", cs, 0, "fsync", "", rep, 102)
						emit("copyup", cs, 0, "reg", "", rep, 102)
						emit("copyup", cs, 0, "dir", "", rep, 2)
					}
				}
			}
		}
		for l := 1; l <= 3; l++ {
			emit("inodes", "overlay-ext4", float64(l), "inodes", "inodes", rep, float64(100+10*l))
			emit("inodes", "hardlink-ext4", float64(l), "inodes", "inodes", rep, float64(100+10*l)*float64(l))
		}
		emit("inodes", "overlay-ext4", 3, "build_s", "s", rep, 1)
		emit("inodes", "hardlink-ext4", 3, "build_s", "s", rep, 4)
	}
	if err := ex.EmitEnv(&out, ex.Env{"trace_xfs": "ovl_copy_up_end: method=clone cloned=67108864"}); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func TestRunWritesTablesPlotsResults(t *testing.T) {
	dir := t.TempDir()
	var stdout bytes.Buffer
	args := []string{"-out", dir, "-results", filepath.Join(dir, "r", "results.json"), "-accel", "tcg"}
	if err := run(args, strings.NewReader(synthetic(t, "")), &stdout); err != nil {
		t.Fatal(err)
	}
	out := stdout.String()
	for _, want := range []string{
		// cycle of overlay-ext4 at N=1: 3,6,9,12,15 → median 9.
		"overlay-ext4       1   6.00       3.00        9.00 (3.00–15.0)    111           1                     –\n",
		// copy-ext4 is five times overlay-ext4 in every repetition.
		"copy-ext4          10  30.0       15.0        45.0 (15.0–75.0)    22.2          5.00                  –",
		// page cache: copies grow with N, overlay does not.
		"copy-ext4       10  200 (200–200)                10.0          9.91 (9.82–10.0)",
		// strict against direct and against auto on ext4.
		"overlay-ext4-strict  4 KiB      6.00 (2.00–10.0)  0.683  0.667 × direct-ext4, 2.00 × overlay-ext4-auto\n",
		"method=clone cloned=67108864",
		"accelerator    tcg\n",
		"mem_total_mib  1500\n",
		"overlay-xfs-auto     102           2             1 MiB   0       102\n",
		// inodes: three layers, hardlink three times overlay.
		"3       130             390              3.00\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for exp, want := range map[string]string{"env": "The guest", "createdestroy": "Experiment 1", "pagecache": "Experiment 2", "copyup": "Experiment 3", "inodes": "Experiment 4"} {
		tables, err := os.ReadFile(filepath.Join(dir, "bench-"+exp+".rst"))
		if err != nil || !strings.Contains(string(tables), "**"+want) || (exp != "env" && strings.Count(string(tables), "Experiment ") != strings.Count(string(tables), want)) {
			t.Errorf("tables of %s: %v\n%s", exp, err, tables)
		}
	}
	for _, name := range []string{"bench-createdestroy.png", "bench-pagecache.png", "bench-copyup.png", "bench-inodes.png"} {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if b := img.Bounds(); b.Dx() < 400 || b.Dy() < 200 {
			t.Errorf("%s is %v", name, b)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "r", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got Report
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Env["accelerator"] != "tcg" || got.Env["kernel"] != "6.1.0-ovlkit" {
		t.Errorf("env %v", got.Env)
	}
	var found bool
	for _, s := range got.Summaries {
		if s.Exp == "createdestroy" && s.Case == "copy-ext4/overlay-ext4" && s.X == 10 && s.Metric == "cycle_ms" {
			found = true
			if s.N != 5 || s.Median != 5 || s.Min != 5 || s.Max != 5 {
				t.Errorf("ratio summary %+v, want 5 in each of 5 repetitions", s)
			}
		}
	}
	if !found {
		t.Errorf("no ratio summary in the results")
	}
	if len(got.Records) == 0 {
		t.Errorf("no records in the results")
	}
}

func TestRunFailsOnIncompleteRuns(t *testing.T) {
	var stdout bytes.Buffer
	if err := run(nil, strings.NewReader("no records here\n"), &stdout); err == nil {
		t.Errorf("input without records was accepted")
	}
	// The baseline of experiment 1 is missing: its ratios cannot be made.
	if err := run(nil, strings.NewReader(synthetic(t, "overlay-ext4")), &stdout); err == nil || !strings.Contains(err.Error(), "overlay-ext4") {
		t.Errorf("a run without the baseline case: %v", err)
	}
	if err := run([]string{"extra"}, strings.NewReader(""), &stdout); err == nil {
		t.Errorf("a stray argument was accepted")
	}
}

func TestChartRefusesWhatItCannotDraw(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.png")
	if err := (chart{title: "t"}).save(p); err == nil {
		t.Errorf("an empty chart was saved")
	}
	c := chart{logY: true, series: []series{{name: "s", points: []ex.Summary{{X: 1, Median: 1, Min: 0, Max: 2}}}}}
	if err := c.save(p); err == nil {
		t.Errorf("a zero on a log axis was accepted")
	}
}
