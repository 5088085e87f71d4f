// Command benchplot turns the output of the experiments of package
// experiments (a `go test -json` stream as ovlvm -json writes it, or
// plain test output) into tables, printed and written as
// reStructuredText (bench-EXP.rst), a PNG plot per experiment
// (bench-EXP.png), and a JSON result file with the guest's description,
// every sample and every summary.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/ovlkit/ovlkit/bench/experiments"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchplot:", err)
		os.Exit(1)
	}
}

func run(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("benchplot", flag.ContinueOnError)
	in := fs.String("in", "", "the experiments' go test -json output (default standard input)")
	out := fs.String("out", "", "directory to write a PNG plot and a reStructuredText file of tables per experiment to (none when empty)")
	results := fs.String("results", "", "file to write the JSON results to (none when empty)")
	accel := fs.String("accel", "", "the accelerator the guest ran under, recorded in the results")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	r := stdin
	if *in != "" {
		f, err := os.Open(*in)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	recs, env, err := experiments.Parse(r)
	if err != nil {
		return err
	}
	if *accel != "" {
		env["accelerator"] = *accel
	}
	rep, err := build(recs, env)
	if err != nil {
		return err
	}
	if _, err := io.WriteString(stdout, rep.text("", false)); err != nil {
		return err
	}
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			return err
		}
		tables, err := rep.saveTables(*out)
		if err != nil {
			return err
		}
		plots, err := rep.savePlots(*out)
		if err != nil {
			return err
		}
		for _, p := range append(tables, plots...) {
			fmt.Fprintf(stdout, "wrote %s\n", p)
		}
	}
	if *results != "" {
		b, err := json.MarshalIndent(rep, "", " ")
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(*results), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(*results, append(b, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "results: %s\n", *results)
	}
	return nil
}
