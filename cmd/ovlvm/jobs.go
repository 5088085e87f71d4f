package main

// ovlvm jobs and ovlvm merge: the guest test matrix as independent jobs for
// a CI engine, and their results as one table and one JUnit report.
//
//	ovlvm jobs  [-json|-commands] [-kernels] [-base B,..] [-config C,..] [-fs F,..] [-suite S,..]
//	ovlvm merge [-jobs FILE | filters] [-dir DIR] [-junit FILE] [-json FILE]

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/ovlkit/ovlkit/vm/cijob"
	"github.com/ovlkit/ovlkit/vm/report"
)

// cmdJobsMerge runs "ovlvm jobs" or "ovlvm merge".
func cmdJobsMerge(name string, args []string) error {
	if name == "merge" {
		return cmdMerge(os.Stdout, args)
	}
	return cmdJobs(os.Stdout, args)
}

// jobFlags are the flags that select jobs, shared by both commands.
type jobFlags struct {
	top, out                    string
	bases, configs, fss, suites string
}

func (f *jobFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.top, "C", ".", "ovlkit source tree")
	fs.StringVar(&f.out, "out", "build/jobs", "directory, relative to the source tree, the jobs write their results to")
	fs.StringVar(&f.bases, "base", "", "comma-separated kernel bases (default: every patches/*/series)")
	fs.StringVar(&f.configs, "config", "", "comma-separated kernel configurations: default, debug (default: both)")
	fs.StringVar(&f.fss, "fs", "", "comma-separated upper filesystems: tmpfs, ext4, xfs, btrfs, or all for suites run once (default: every one)")
	fs.StringVar(&f.suites, "suite", "", "comma-separated guest suites, as in the results table (default: every one)")
}

func (f *jobFlags) list() ([]cijob.Job, error) {
	return cijob.List(f.top, f.out, cijob.Filter{
		Bases: splitList(f.bases), Configs: splitList(f.configs),
		FS: splitList(f.fss), Suites: splitList(f.suites),
	})
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

func cmdJobs(w io.Writer, args []string) error {
	fs := flag.NewFlagSet("jobs", flag.ContinueOnError)
	var f jobFlags
	f.register(fs)
	asJSON := fs.Bool("json", false, "print the list as JSON, on one line (a CI matrix)")
	commands := fs.Bool("commands", false, "print each job's command, one a line")
	kernels := fs.Bool("kernels", false, "list the kernel builds the selected jobs need instead of the jobs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("jobs: unexpected arguments %q", fs.Args())
	}
	if *asJSON && *commands {
		return fmt.Errorf("jobs: -json and -commands exclude each other")
	}
	jobs, err := f.list()
	if err != nil {
		return err
	}
	format := listFormat{json: *asJSON, commands: *commands}
	if *kernels {
		builds := cijob.KernelBuilds(jobs)
		return writeList(w, format, builds, "ID\tBASE\tCONFIG\tCOMMAND",
			func(b cijob.KernelBuild) (string, []any) {
				return b.Command, []any{b.ID, b.Base, b.Config, b.Command}
			})
	}
	err = writeList(w, format, jobs, "ID\tBASE\tCONFIG\tFS\tSUITE\tTIMEOUT",
		func(j cijob.Job) (string, []any) {
			return j.Command, []any{j.ID, j.Base, j.Config, j.FS, j.Suite, fmt.Sprintf("%dm", j.TimeoutMinutes)}
		})
	if err != nil || format.json || format.commands {
		return err
	}
	_, err = fmt.Fprintf(w, "%d jobs on %d kernel builds; each boots the stock and the patched kernel (-commands prints their commands)\n",
		len(jobs), len(cijob.KernelBuilds(jobs)))
	return err
}

// writeJSONLine writes v as JSON on one line, with "&&" and "<" as they
// are: the commands are for shells, not HTML.
func writeJSONLine(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func cmdMerge(w io.Writer, args []string) error {
	fs := flag.NewFlagSet("merge", flag.ContinueOnError)
	var f jobFlags
	f.register(fs)
	jobsFile := fs.String("jobs", "", "the job list, as ovlvm jobs -json printed it (default: the jobs the filter flags select)")
	dir := fs.String("dir", "", "directory holding each job's ID.xml and ID.json (default: -out under -C)")
	junit := fs.String("junit", "", "write the merged JUnit XML report here")
	jsonOut := fs.String("json", "", "write every job's go test -json events here")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("merge: unexpected arguments %q", fs.Args())
	}
	var jobs []cijob.Job
	var err error
	if *jobsFile != "" {
		jobs, err = cijob.Read(*jobsFile)
	} else {
		jobs, err = f.list()
	}
	if err != nil {
		return err
	}
	if *dir == "" {
		*dir = f.top + "/" + f.out
	}
	m := cijob.Merge(*dir, jobs)
	report.WriteTable(w, m.Results...)
	if *junit != "" {
		if err := report.WriteJUnit(*junit, m.Results...); err != nil {
			return err
		}
		progress("JUnit report: %s", *junit)
	}
	if *jsonOut != "" {
		if err := report.WriteJSON(*jsonOut, m.Results...); err != nil {
			return fmt.Errorf("write go test -json events: %w", err)
		}
		progress("go test -json events: %s", *jsonOut)
	}
	for _, miss := range m.Missing {
		fmt.Fprintf(w, "MISSING %s\n", miss)
	}
	fmt.Fprintf(w, "%d of %d jobs reported; %d runs failed, %d jobs missing\n",
		len(jobs)-len(m.Missing), len(jobs), len(m.Failed), len(m.Missing))
	var problems []string
	if len(m.Failed) > 0 {
		problems = append(problems, fmt.Sprintf("%d runs failed (%s)", len(m.Failed), strings.Join(m.Failed, ", ")))
	}
	if len(m.Missing) > 0 {
		problems = append(problems, fmt.Sprintf("%d of %d jobs missing", len(m.Missing), len(jobs)))
	}
	if len(problems) > 0 {
		return fmt.Errorf("merge: %s", strings.Join(problems, "; "))
	}
	return nil
}

// listFormat is how jobs prints a list: a JSON line, one command a line,
// or a table.
type listFormat struct{ json, commands bool }

// writeList prints items in format f; row gives an item's command and its
// table cells under header (tab-separated).
func writeList[T any](w io.Writer, f listFormat, items []T, header string, row func(T) (string, []any)) error {
	switch {
	case f.json:
		return writeJSONLine(w, items)
	case f.commands:
		for _, it := range items {
			cmd, _ := row(it)
			fmt.Fprintln(w, cmd)
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, it := range items {
		_, cells := row(it)
		for i, c := range cells {
			if i > 0 {
				fmt.Fprint(tw, "\t")
			}
			fmt.Fprint(tw, c)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}
