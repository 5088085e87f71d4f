package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	ex "github.com/ovlkit/ovlkit/bench/experiments"
)

// ratio is a quotient computed within each repetition.
type ratio struct{ exp, metric, num, den string }

// ratios lists what each experiment is compared against.
var ratios = []ratio{
	{"createdestroy", "cycle_ms", "overlay-xfs", "overlay-ext4"},
	{"createdestroy", "cycle_ms", "hardlink-ext4", "overlay-ext4"},
	{"createdestroy", "cycle_ms", "overlay-bare-ext4", "overlay-ext4"},
	{"createdestroy", "cycle_ms", "btrfs-snapshot", "overlay-bare-ext4"},
	{"createdestroy", "cycle_ms", "btrfs-snapshot", "overlay-ext4"},
	{"createdestroy", "cycle_ms", "copy-ext4", "overlay-ext4"},
	{"pagecache", "cached_mib", "btrfs-snapshot", "overlay-ext4"},
	{"pagecache", "cached_mib", "copy-ext4", "overlay-ext4"},
	{"inodes", "inodes", "hardlink-ext4", "overlay-ext4"},
}

// copyUpBase names each copy-up case's baseline: the direct write on the
// same filesystem, and for strict the same overlay with fsync=auto.
var copyUpBase = map[string][]string{
	"overlay-ext4-auto":   {"direct-ext4"},
	"overlay-ext4-strict": {"direct-ext4", "overlay-ext4-auto"},
	"overlay-xfs-auto":    {"direct-xfs"},
	"overlay-xfs-strict":  {"direct-xfs", "overlay-xfs-auto"},
	"btrfs-snapshot":      {"direct-xfs", "overlay-xfs-auto"},
}

func init() {
	cases := make([]string, 0, len(copyUpBase))
	for c := range copyUpBase {
		cases = append(cases, c)
	}
	sort.Strings(cases)
	for _, c := range cases {
		for _, d := range copyUpBase[c] {
			ratios = append(ratios,
				ratio{"copyup", "ms", c, d},
				ratio{"copyup", "ms", c + "-tree", d + "-tree"})
		}
	}
}

// Report is the result file: the guest, every sample and every summary.
type Report struct {
	Env       ex.Env       `json:"env"`
	Summaries []ex.Summary `json:"summaries"`
	Records   []ex.Record  `json:"records"`

	tables []table
	charts map[string]chart // by file name
}

type table struct{ exp, title, text string }

// build computes ratios, summaries, tables and charts from the records of
// a run. An experiment without any record is left out; one that lacks a
// case its comparisons need is an error.
func build(recs []ex.Record, env ex.Env) (*Report, error) {
	if len(recs) == 0 {
		return nil, fmt.Errorf("no experiment records in the input")
	}
	has := map[string]bool{}
	for _, r := range recs {
		has[r.Exp] = true
	}
	all := append([]ex.Record(nil), recs...)
	for _, q := range ratios {
		if !has[q.exp] {
			continue
		}
		rs, err := ex.Ratios(recs, q.exp, q.metric, q.num, q.den)
		if err != nil {
			return nil, err
		}
		all = append(all, rs...)
	}
	rep := &Report{Env: env, Summaries: ex.Summarize(all), Records: recs, charts: map[string]chart{}}
	if err := rep.guest(); err != nil {
		return nil, err
	}
	for _, exp := range []struct {
		name string
		fn   func() error
	}{{"createdestroy", rep.createDestroy}, {"pagecache", rep.pageCache}, {"copyup", rep.copyUp}, {"inodes", rep.inodes}} {
		if !has[exp.name] {
			continue
		}
		if err := exp.fn(); err != nil {
			return nil, fmt.Errorf("%s: %w", exp.name, err)
		}
	}
	return rep, nil
}

// find returns the summary of one group, or false.
func (r *Report) find(exp, cs string, x float64, metric string) (ex.Summary, bool) {
	for _, s := range r.Summaries {
		if s.Exp == exp && s.Case == cs && s.X == x && s.Metric == metric {
			return s, true
		}
	}
	return ex.Summary{}, false
}

// cell formats a group as "median (min–max)", "–" when there is none.
func (r *Report) cell(exp, cs string, x float64, metric string, spread bool) string {
	s, ok := r.find(exp, cs, x, metric)
	if !ok {
		return "–"
	}
	if spread {
		return ex.Spread(s)
	}
	return ex.Num(s.Median)
}

func (r *Report) addTable(exp, title string, header []string, rows [][]string) error {
	text, err := ex.RSTTable(header, rows)
	if err != nil {
		return fmt.Errorf("%s: %w", title, err)
	}
	r.tables = append(r.tables, table{exp, title, text})
	return nil
}

// seriesOf returns one series per case of exp's metric, leaving out the
// cases for which skip is true.
func (r *Report) seriesOf(exp, metric string, skip func(string) bool) []series {
	ss := ex.Select(r.Summaries, exp, metric)
	var out []series
	for _, cs := range ex.Cases(ss) {
		if skip != nil && skip(cs) {
			continue
		}
		var pts []ex.Summary
		for _, s := range ss {
			if s.Case == cs {
				pts = append(pts, s)
			}
		}
		sort.Slice(pts, func(i, j int) bool { return pts[i].X < pts[j].X })
		out = append(out, series{name: cs, points: pts})
	}
	return out
}

func isRatio(cs string) bool { return strings.Contains(cs, "/") }

// xs returns the parameters of exp's metric for case cs, ascending.
func (r *Report) xs(exp, cs, metric string) []float64 {
	var out []float64
	for _, s := range r.Summaries {
		if s.Exp == exp && s.Case == cs && s.Metric == metric {
			out = append(out, s.X)
		}
	}
	sort.Float64s(out)
	return out
}

// guest tables the guest's description (the trace events are shown with
// experiment 3).
func (r *Report) guest() error {
	keys := make([]string, 0, len(r.Env))
	for k := range r.Env {
		if !strings.HasPrefix(k, "trace_") && r.Env[k] != "" {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	sort.Strings(keys)
	rows := make([][]string, 0, len(keys))
	for _, k := range keys {
		rows = append(rows, []string{k, r.Env[k]})
	}
	return r.addTable("env", "The guest", []string{"what", "value"}, rows)
}

func (r *Report) createDestroy() error {
	const exp = "createdestroy"
	var rows [][]string
	for _, cs := range ex.Cases(ex.Select(r.Summaries, exp, "cycle_ms")) {
		if isRatio(cs) {
			continue
		}
		for _, x := range r.xs(exp, cs, "cycle_ms") {
			vs := r.ratioTo(exp, cs, "overlay-ext4", x, "cycle_ms")
			bare := r.ratioTo(exp, cs, "overlay-bare-ext4", x, "cycle_ms")
			rows = append(rows, []string{cs, count(x),
				r.cell(exp, cs, x, "create_ms", false), r.cell(exp, cs, x, "destroy_ms", false),
				r.cell(exp, cs, x, "cycle_ms", true), r.cell(exp, cs, x, "throughput", false), vs, bare})
		}
	}
	if err := r.addTable(exp, "Experiment 1: create+mount and unmount+remove, per container",
		[]string{"case", "N", "create ms", "destroy ms", "cycle ms (min–max)", "containers/s", "cycle × overlay-ext4", "cycle × overlay-bare-ext4"}, rows); err != nil {
		return err
	}
	r.charts["bench-createdestroy.png"] = chart{
		title: "Create+mount+unmount+remove, per container", xLabel: "containers N", yLabel: "ms per container (median, min–max)",
		logX: true, logY: true, xTick: count, series: r.seriesOf(exp, "cycle_ms", isRatio),
	}
	return nil
}

func (r *Report) pageCache() error {
	const exp = "pagecache"
	var rows [][]string
	for _, cs := range ex.Cases(ex.Select(r.Summaries, exp, "cached_mib")) {
		if isRatio(cs) {
			continue
		}
		for _, x := range r.xs(exp, cs, "cached_mib") {
			vs := r.ratioTo(exp, cs, "overlay-ext4", x, "cached_mib")
			rows = append(rows, []string{cs, count(x),
				r.cell(exp, cs, x, "cached_mib", true), r.cell(exp, cs, x, "cached_per_image", false), vs,
				r.cell(exp, cs, x, "origin_resident_pct", false), r.cell(exp, cs, x, "container_resident_pct", false)})
		}
	}
	if err := r.addTable(exp, "Experiment 2: growth of Cached after N containers read the image",
		[]string{"case", "N", "Cached growth MiB (min–max)", "× image data", "× overlay-ext4", "image's file cached %", "container's file cached %"}, rows); err != nil {
		return err
	}
	r.charts["bench-pagecache.png"] = chart{
		title: "Page cache after N containers read the same data", xLabel: "containers N", yLabel: "growth of Cached, MiB (median, min–max)",
		xTick:  count,
		series: r.seriesOf(exp, "cached_mib", isRatio),
	}
	return nil
}

func (r *Report) copyUp() error {
	const exp = "copyup"
	var rows, treeRows, counterRows [][]string
	for _, cs := range ex.Cases(ex.Select(r.Summaries, exp, "ms")) {
		if isRatio(cs) {
			continue
		}
		plain := strings.TrimSuffix(cs, "-tree")
		var vs []string
		for _, den := range copyUpBase[plain] {
			suffix := strings.TrimPrefix(cs, plain)
			vs = append(vs, den+suffix)
		}
		for _, x := range r.xs(exp, cs, "ms") {
			var cmp []string
			for _, den := range vs {
				cmp = append(cmp, fmt.Sprintf("%s × %s", r.cell(exp, cs+"/"+den, x, "ms", false), strings.TrimSuffix(den, "-tree")))
			}
			if len(cmp) == 0 {
				cmp = []string{"baseline"}
			}
			if cs != plain {
				treeRows = append(treeRows, []string{plain, count(x), r.cell(exp, cs, x, "ms", true),
					r.cell(exp, cs, x, "files_per_s", false), strings.Join(cmp, ", ")})
				continue
			}
			rows = append(rows, []string{cs, ex.Bytes(x), r.cell(exp, cs, x, "ms", true),
				r.cell(exp, cs, x, "mb_per_s", false), strings.Join(cmp, ", ")})
		}
		if _, ok := r.find(exp, cs, 0, "copied_bytes"); ok {
			counterRows = append(counterRows, []string{cs,
				countCell(r, exp, cs, "reg"), countCell(r, exp, cs, "dir"),
				bytesCell(r, exp, cs, "copied_bytes"), bytesCell(r, exp, cs, "cloned_bytes"),
				countCell(r, exp, cs, "fsync")})
		}
	}
	if err := r.addTable(exp, "Experiment 3: first write to one lower file (open, 4 KiB write, fsync)",
		[]string{"case", "file size", "ms (min–max)", "MB/s", "time × baseline (same repetition)"}, rows); err != nil {
		return err
	}
	if err := r.addTable(exp, "Experiment 3: first write to every file of a tree, then syncfs",
		[]string{"case", "files", "ms (min–max)", "files/s", "time × baseline (same repetition)"}, treeRows); err != nil {
		return err
	}
	if len(counterRows) > 0 {
		if err := r.addTable(exp, "Experiment 3: the overlay's copy-up counters per repetition (medians)",
			[]string{"case", "reg copy-ups", "dir copy-ups", "copied", "cloned", "fsyncs"}, counterRows); err != nil {
			return err
		}
	}
	for _, k := range []string{"trace_ext4", "trace_xfs"} {
		if ev, ok := r.Env[k]; ok {
			r.tables = append(r.tables, table{exp, "Experiment 3: ovl_copy_up_end on " + strings.TrimPrefix(k, "trace_"), "::\n\n  " + ev + "\n"})
		}
	}
	r.charts["bench-copyup.png"] = chart{
		title: "First write to a lower file", xLabel: "file size", yLabel: "MB/s of the file size (median, min–max)",
		logX: true, logY: true, xTick: ex.Bytes,
		series: r.seriesOf(exp, "mb_per_s", func(cs string) bool { return isRatio(cs) || strings.HasSuffix(cs, "-tree") }),
	}
	return nil
}

func countCell(r *Report, exp, cs, metric string) string {
	s, ok := r.find(exp, cs, 0, metric)
	if !ok {
		return "–"
	}
	return count(s.Median)
}

func bytesCell(r *Report, exp, cs, metric string) string {
	s, ok := r.find(exp, cs, 0, metric)
	if !ok {
		return "–"
	}
	if s.Median == 0 {
		return "0"
	}
	return ex.Bytes(s.Median)
}

func (r *Report) inodes() error {
	const exp = "inodes"
	var rows [][]string
	layers := r.xs(exp, "overlay-ext4", "inodes")
	show := map[float64]bool{}
	for _, x := range []float64{1, 2, 5, 10, 20, 30, 40, 50} {
		show[x] = true
	}
	if len(layers) > 0 {
		show[layers[len(layers)-1]] = true
	}
	for _, x := range layers {
		if !show[x] {
			continue
		}
		rows = append(rows, []string{count(x), r.cell(exp, "overlay-ext4", x, "inodes", true),
			r.cell(exp, "hardlink-ext4", x, "inodes", true), r.cell(exp, "hardlink-ext4/overlay-ext4", x, "inodes", false)})
	}
	if err := r.addTable(exp, "Experiment 4: inodes used by a stack of image layers on ext4",
		[]string{"layers", "overlay layout", "hardlink layout", "hardlink × overlay"}, rows); err != nil {
		return err
	}
	var build [][]string
	for _, cs := range []string{"overlay-ext4", "hardlink-ext4"} {
		xs := r.xs(exp, cs, "build_s")
		if len(xs) == 0 {
			return fmt.Errorf("no build time of %s", cs)
		}
		build = append(build, []string{cs, count(xs[0]), r.cell(exp, cs, xs[0], "build_s", true)})
	}
	if err := r.addTable(exp, "Experiment 4: time to build the stack", []string{"case", "layers", "s (min–max)"}, build); err != nil {
		return err
	}
	r.charts["bench-inodes.png"] = chart{
		title: "Inodes used by a stack of image layers (ext4)", xLabel: "image layers", yLabel: "inodes used",
		series: r.seriesOf(exp, "inodes", isRatio),
	}
	return nil
}

// text is the tables of exp ("" for all) with their titles: underlined
// for a terminal, or for the documentation (rst) as bold paragraphs,
// which take no place in the including page's section levels.
func (r *Report) text(exp string, rst bool) string {
	var sb strings.Builder
	for _, t := range r.tables {
		if exp != "" && t.exp != exp {
			continue
		}
		if rst {
			fmt.Fprintf(&sb, "**%s**\n\n%s\n", t.title, t.text)
		} else {
			fmt.Fprintf(&sb, "%s\n%s\n\n%s\n", t.title, strings.Repeat("~", len([]rune(t.title))), t.text)
		}
	}
	return sb.String()
}

// saveTables writes the tables of each experiment to dir/bench-EXP.rst.
func (r *Report) saveTables(dir string) ([]string, error) {
	var paths []string
	seen := map[string]bool{}
	for _, t := range r.tables {
		if seen[t.exp] {
			continue
		}
		seen[t.exp] = true
		p := filepath.Join(dir, "bench-"+t.exp+".rst")
		head := ".. Generated by bench/cmd/benchplot from the output of make bench; do not edit.\n\n"
		if err := os.WriteFile(p, []byte(head+r.text(t.exp, true)), 0o644); err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// savePlots writes every chart into dir.
func (r *Report) savePlots(dir string) ([]string, error) {
	names := make([]string, 0, len(r.charts))
	for name := range r.charts {
		names = append(names, name)
	}
	sort.Strings(names)
	var paths []string
	for _, name := range names {
		p := filepath.Join(dir, name)
		if err := r.charts[name].save(p); err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// count formats a parameter that counts things.
func count(x float64) string { return fmt.Sprintf("%g", x) }

// ratioTo is the cell of case cs's metric against case base's at x, "1"
// for base itself.
func (r *Report) ratioTo(exp, cs, base string, x float64, metric string) string {
	if cs == base {
		return "1"
	}
	return r.cell(exp, cs+"/"+base, x, metric, true)
}
