package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/layer"
)

// env is what a command touches outside itself, so tests can run the CLI
// on a store whose features they supply.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	open           func(home string, opts graph.Options) (*graph.Store, error)
}

// command is a parsed command line.
type command struct {
	home     string
	json     bool
	name     string
	id       string
	parent   string
	rw       bool
	layout   graph.Layout
	userx    bool
	volatile bool
	limits   layer.Limits
	verify   bool // check: compare layers with their manifests
	repair   bool // check: repair what verify finds
}

const usage = `usage: ovlgraph --home DIR [--json] COMMAND [ARGS]

commands:
  init [--layout overlay|hardlink] [--userxattr]
                                     create the store
  create [--rw] [--parent P] ID      create an empty image (--rw: container) layer
  apply [--max-size B] [--max-entries N] [--max-depth N] [--max-window B] ID < layer.tar[.gz|.zst]
                                     fill an empty layer from a tar layer; a layer
                                     over a limit is refused (0: the default,
                                     64 GiB, 4000000, 256, 128 MiB; -1: none)
  mount [--volatile] ID              mount and print the path (reference-counted);
                                     --volatile: no syncs, and refused after a reboot
  umount ID                          drop one reference; unmount at zero
  diff ID > out.tar                  write the layer's changes as a tar layer
  changes ID                         list added (A), changed (C), deleted (D) paths
  rm ID                              remove a layer without children
  ls                                 list the layers
  status                             layout, backing fs, kernel features, mounts
  check [--verify [--repair]] [ID]   verify the store's invariants; --verify also
                                     compares every layer (or ID) with the manifest
                                     it was applied with, --repair rebuilds links
                                     and records and resets layers whose content
                                     is lost, for their tar to be applied again

exit status: 0 success, 1 failure (check: a problem or damage remains),
2 command-line error, 3 check --verify: the store is sound but layers wait
for their tar to be applied again (needs-apply)
`

// errUsage marks a command line error, answered with the usage text.
var errUsage = errors.New("usage")

func parse(args []string) (command, error) {
	var c command
	g := flag.NewFlagSet("ovlgraph", flag.ContinueOnError)
	g.SetOutput(io.Discard)
	g.StringVar(&c.home, "home", "", "store directory")
	g.BoolVar(&c.json, "json", false, "machine-readable output")
	if err := g.Parse(args); err != nil {
		return c, fmt.Errorf("%w: %v", errUsage, err)
	}
	rest := g.Args()
	if len(rest) == 0 {
		return c, fmt.Errorf("%w: no command", errUsage)
	}
	c.name, rest = rest[0], rest[1:]
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.BoolVar(&c.json, "json", c.json, "machine-readable output")
	var layout string
	nargs := 1
	switch c.name {
	case "init":
		fs.StringVar(&layout, "layout", string(graph.LayoutOverlay), "overlay or hardlink")
		fs.BoolVar(&c.userx, "userxattr", false, "keep overlay metadata in user.overlay.* xattrs")
		nargs = 0
	case "create":
		fs.BoolVar(&c.rw, "rw", false, "container (read-write) layer")
		fs.StringVar(&c.parent, "parent", "", "parent layer")
	case "mount":
		fs.BoolVar(&c.volatile, "volatile", false, "mount a container layer with the overlay volatile option")
	case "apply":
		fs.Int64Var(&c.limits.MaxSize, "max-size", 0, "bytes of regular files (0: default, -1: no limit)")
		fs.Int64Var(&c.limits.MaxEntries, "max-entries", 0, "tar entries (0: default, -1: no limit)")
		fs.IntVar(&c.limits.MaxDepth, "max-depth", 0, "path components (0: default, -1: no limit)")
		fs.Int64Var(&c.limits.MaxDecoderWindow, "max-window", 0, "zstd window bytes (0: default, -1: the decoder's maximum)")
	case "umount", "diff", "changes", "rm":
	case "check":
		fs.BoolVar(&c.verify, "verify", false, "compare layers with their manifests")
		fs.BoolVar(&c.repair, "repair", false, "repair what --verify finds")
		nargs = 0
	case "ls", "status":
		nargs = 0
	default:
		return c, fmt.Errorf("%w: unknown command %q", errUsage, c.name)
	}
	if err := fs.Parse(rest); err != nil {
		return c, fmt.Errorf("%w: %s: %v", errUsage, c.name, err)
	}
	if c.repair && !c.verify {
		return c, fmt.Errorf("%w: check: --repair needs --verify", errUsage)
	}
	if c.verify && fs.NArg() == 1 {
		nargs = 1 // check --verify ID
	}
	if fs.NArg() != nargs {
		return c, fmt.Errorf("%w: %s takes %d argument(s), got %d", errUsage, c.name, nargs, fs.NArg())
	}
	if nargs == 1 {
		c.id = fs.Arg(0)
	}
	if c.name == "init" {
		c.layout = graph.Layout(layout)
		if c.layout.Valid() != nil {
			return c, fmt.Errorf("%w: unknown layout %q", errUsage, layout)
		}
	}
	if c.home == "" {
		return c, fmt.Errorf("%w: --home is required", errUsage)
	}
	return c, nil
}

func run(ctx context.Context, args []string, e *env) int {
	c, err := parse(args)
	if err != nil {
		fmt.Fprintf(e.stderr, "ovlgraph: %s\n", escapeMessage(err.Error()))
		if errors.Is(err, errUsage) {
			fmt.Fprint(e.stderr, usage)
		}
		return 2
	}
	if err := c.exec(ctx, e); err != nil {
		// Errors name paths inside layers, which the layer's author chose.
		fmt.Fprintf(e.stderr, "ovlgraph %s: %s\n", c.name, escapeMessage(err.Error()))
		var ex exitStatus
		if errors.As(err, &ex) {
			return ex.code
		}
		return 1
	}
	return 0
}

// exitStatus is an outcome that is not a failure but has its own exit
// status (3: layers wait for their tar).
type exitStatus struct {
	code int
	msg  string
}

func (e exitStatus) Error() string { return e.msg }

func (c command) exec(ctx context.Context, e *env) error {
	// Cleanups the store could not finish leave something for the next
	// Open to reclaim; a warning on stderr says so. slog quotes values
	// that hold spaces or control characters, as escapeMessage does.
	logger := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	opts := graph.Options{Volatile: c.volatile, Limits: c.limits, Logger: logger}
	if c.name == "init" {
		opts.Create, opts.Layout, opts.Userxattr = true, c.layout, c.userx
	}
	s, err := e.open(c.home, opts)
	if err != nil {
		return err
	}
	defer s.Close()
	out := e.stdout
	switch c.name {
	case "init":
		return c.emit(out, map[string]any{"home": s.Home(), "layout": s.Layout()},
			fmt.Sprintf("store %s (layout %s)\n", quoteName(s.Home()), s.Layout()))
	case "create":
		return c.create(ctx, s, out)
	case "apply":
		n, err := s.ApplyDiff(ctx, c.id, e.stdin)
		if err != nil {
			return err
		}
		return c.emit(out, map[string]any{"id": c.id, "size": n}, fmt.Sprintf("applied %s: %d bytes\n", quoteName(c.id), n))
	case "mount":
		p, err := s.Get(ctx, c.id)
		if err != nil {
			return err
		}
		return c.emit(out, map[string]any{"id": c.id, "path": p}, quoteName(p)+"\n")
	case "umount":
		return c.umount(ctx, s, out)
	case "diff":
		if f, ok := out.(*os.File); ok && isTerminal(f) {
			return errors.New("refusing to write a tar to a terminal; redirect stdout")
		}
		return s.Diff(ctx, c.id, out)
	case "changes":
		ch, err := s.Changes(ctx, c.id)
		if err != nil {
			return err
		}
		return c.emitChanges(out, ch)
	case "rm":
		if err := s.Remove(ctx, c.id); err != nil {
			return err
		}
		return c.emit(out, map[string]any{"id": c.id, "removed": true}, fmt.Sprintf("removed %s\n", quoteName(c.id)))
	case "ls":
		ls, err := s.Layers()
		if err != nil {
			return err
		}
		return c.emitLayers(out, ls)
	case "status":
		st, err := s.Status()
		if err != nil {
			return err
		}
		return c.emitStatus(out, st)
	case "check":
		if c.verify {
			return c.verifyStore(ctx, s, out)
		}
		return c.check(s, out)
	}
	return fmt.Errorf("unknown command %q", c.name)
}

func (c command) create(ctx context.Context, s *graph.Store, out io.Writer) error {
	var err error
	if c.rw {
		err = s.CreateReadWrite(ctx, c.id, c.parent)
	} else {
		err = s.Create(ctx, c.id, c.parent)
	}
	if err != nil {
		return err
	}
	li, err := s.Layer(c.id)
	if err != nil {
		return err
	}
	return c.emit(out, li, fmt.Sprintf("created %s\n", quoteName(c.id)))
}

func (c command) umount(ctx context.Context, s *graph.Store, out io.Writer) error {
	if err := s.Put(ctx, c.id); err != nil {
		return err
	}
	li, err := s.Layer(c.id)
	if err != nil {
		return err
	}
	return c.emit(out, map[string]any{"id": c.id, "mounts": li.Mounts},
		fmt.Sprintf("%s: %d reference(s) left\n", quoteName(c.id), li.Mounts))
}

// check prints the store's problems and fails when there are any.
func (c command) check(s *graph.Store, out io.Writer) error {
	probs, err := s.Check()
	if err != nil {
		return err
	}
	if c.json {
		if probs == nil {
			probs = []graph.Problem{}
		}
		if err := writeJSON(out, map[string]any{"ok": len(probs) == 0, "problems": probs}); err != nil {
			return err
		}
	} else if len(probs) == 0 {
		fmt.Fprintln(out, "ok")
	} else {
		// A problem can name an entry found in the store's
		// directories, whatever its name.
		for _, p := range probs {
			fmt.Fprintln(out, escapeMessage(p.String()))
		}
	}
	if len(probs) > 0 {
		return fmt.Errorf("%d problem(s)", len(probs))
	}
	return nil
}

func (c command) emit(w io.Writer, v any, human string) error {
	if c.json {
		return writeJSON(w, v)
	}
	_, err := io.WriteString(w, human)
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

func (c command) emitChanges(w io.Writer, ch []layer.Change) error {
	if c.json {
		type jc struct {
			Path string `json:"path"`
			Kind string `json:"kind"`
		}
		out := make([]jc, 0, len(ch))
		for _, x := range ch {
			out = append(out, jc{x.Path, map[layer.ChangeKind]string{layer.ChangeAdd: "add", layer.ChangeModify: "modify", layer.ChangeDelete: "delete"}[x.Kind]})
		}
		return writeJSON(w, out)
	}
	for _, x := range ch {
		// Not x.String(): the path is the layer author's choice.
		if _, err := fmt.Fprintln(w, x.Kind.String()+" "+quoteName(x.Path)); err != nil {
			return err
		}
	}
	return nil
}

func (c command) emitLayers(w io.Writer, ls []graph.LayerInfo) error {
	if c.json {
		if ls == nil {
			ls = []graph.LayerInfo{}
		}
		return writeJSON(w, ls)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPARENT\tKIND\tDEPTH\tSIZE\tMOUNTS")
	for _, l := range ls {
		kind := "image"
		if l.RW {
			kind = "container"
		}
		parent := quoteName(l.Parent)
		if parent == "" {
			parent = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\n", quoteName(l.ID), parent, kind, l.Depth, l.Size, l.Mounts)
	}
	return tw.Flush()
}

func (c command) emitStatus(w io.Writer, st graph.Status) error {
	if c.json {
		return writeJSON(w, st)
	}
	f := st.Features
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "home:          %s\n", quoteName(st.Home))
	fmt.Fprintf(&b, "layout:        %s\n", st.Layout)
	fmt.Fprintf(&b, "userxattr:     %s\n", yes(st.Userxattr))
	fmt.Fprintf(&b, "backing fs:    %s\n", escapeMessage(st.BackingFS))
	fmt.Fprintf(&b, "layers:        %d\n", st.Layers)
	fmt.Fprintf(&b, "sync:          %s\n", st.Sync)
	fmt.Fprintf(&b, "mount method:  %s\n", st.MountMethod)
	fmt.Fprintf(&b, "mount options: %s\n", escapeMessage(strings.Join(st.MountOpts, ",")))
	fmt.Fprintf(&b, "features:      d_type=%s multi_lower=%s redirect_dir=%s metacopy=%s index_param=%s userxattr=%s new_mount_api=%s\n",
		yes(f.DType), yes(f.MultiLower), yes(f.RedirectDir), yes(f.Metacopy), yes(f.IndexParam), yes(f.Userxattr), yes(f.NewMountAPI))
	fmt.Fprintf(&b, "ovlkit series: strict_upper=%s fsync_strict=%s copyup_stats=%s\n",
		yes(f.StrictUpper), yes(f.FsyncStrict), yes(f.CopyUpStats))
	if len(st.Missing) > 0 {
		fmt.Fprintf(&b, "missing:       %s\n", escapeMessage(strings.Join(st.Missing, "; ")))
	}
	for _, m := range st.Mounted {
		ro := "rw"
		if m.ReadOnly {
			ro = "ro"
		}
		fmt.Fprintf(&b, "mounted:       %s %s refs=%d %s", quoteName(m.ID), quoteName(m.Path), m.Refs, ro)
		if len(m.CopyUp) > 0 {
			keys := make([]string, 0, len(m.CopyUp))
			for k := range m.CopyUp {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			b.WriteString(" copy-up:")
			for _, k := range keys {
				fmt.Fprintf(&b, " %s=%d", escapeMessage(k), m.CopyUp[k])
			}
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}
