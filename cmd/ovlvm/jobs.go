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
	if *kernels {
		builds := cijob.KernelBuilds(jobs)
		switch {
		case *asJSON:
			return writeJSONLine(w, builds)
		case *commands:
			for _, b := range builds {
				fmt.Fprintln(w, b.Command)
			}
			return nil
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tBASE\tCONFIG\tCOMMAND")
		for _, b := range builds {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", b.ID, b.Base, b.Config, b.Command)
		}
		return tw.Flush()
	}
	switch {
	case *asJSON:
		return writeJSONLine(w, jobs)
	case *commands:
		for _, j := range jobs {
			fmt.Fprintln(w, j.Command)
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tBASE\tCONFIG\tFS\tSUITE\tTIMEOUT")
	for _, j := range jobs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%dm\n", j.ID, j.Base, j.Config, j.FS, j.Suite, j.TimeoutMinutes)
	}
	if err := tw.Flush(); err != nil {
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
