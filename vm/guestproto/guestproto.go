// Package guestproto is the one definition of what the guest's init
// (initramfs/ovlinit), its tests (tests/guest) and the host (package vm)
// say to each other: the manifest of test binaries the host packs into the
// initramfs, the disk serials, the records the guest frames test output
// with on the results console, the markers by which a test declares what
// it proves or keeps, and the kernel log line that names the test that
// starts running.
//
// It imports nothing beyond the standard library, so the guest's init can
// link it without the host's QEMU and packing code.
package guestproto

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Tag starts every record on the results console, so a record cannot be
// confused with test output. Its first byte is ASCII RS, which tests do
// not print.
const Tag = "\x1eovlkit "

// ResultsPort is the guest's end of the results console: a virtio console
// of its own, apart from the serial console the kernel logs to.
const ResultsPort = "/dev/hvc0"

// ManifestPath is where the manifest lies in the initramfs, relative to
// its root ("/ovlkit/manifest" in the guest).
const ManifestPath = "ovlkit/manifest"

// KmsgMarker starts the kernel log line the guest writes when a test
// starts or resumes: KmsgMarker, the package, a space and the test name.
const KmsgMarker = "ovlkit: run "

// ProofMarker starts the log line by which a guest test names the patch
// of the series it proves: the host then requires it to fail on the stock
// kernel. KeepsMarker starts the line by which a test names behaviour the
// series must not change: the host requires it to pass on both kernels.
const (
	ProofMarker = "ovlkit-proves: "
	KeepsMarker = "ovlkit-keeps: "
)

// The serial of a disk the host attaches is one of these prefixes and the
// name of the filesystem on it, so the guest finds its disks by serial,
// not by probe order. A disk that cannot hold overlay layers (vfat, for
// the tests of refusals) has a prefix of its own, so it never becomes a
// test filesystem by mistake.
const (
	DiskSerialPrefix      = "ovlkit-"
	UnfitDiskSerialPrefix = "ovlunfit-"
)

// DiskFilesystems are the disk-backed upper filesystems the host can
// attach (tmpfs needs no disk).
var DiskFilesystems = []string{"ext4", "xfs", "btrfs"}

// UnfitFilesystems are disks the layer store must refuse to live on,
// attached with UnfitDiskSerialPrefix (tests/guest/guesttest.UnfitDisk).
var UnfitFilesystems = []string{"xfs-ftype0", "vfat"}

// Record kinds, the first word after Tag.
const (
	recStart   = "start"    // the guest kernel's release and version
	recNote    = "note"     // a guest-side problem that did not stop the run
	recError   = "error"    // a guest-side problem that did
	recBegin   = "begin"    // a test binary starts: its package
	recEnd     = "end"      // it ended: package, exit code, seconds
	recKmsg    = "kmsg"     // the kernel log follows, one line a record
	recKmsgEnd = "kmsg-end" // the kernel log ended
	recDone    = "done"     // the guest reached the end of its run
)

// ModulesDir is where the initramfs holds the modules of a kernel whose
// drivers are modules, relative to its root. Not lib/modules: u-root's init loads every
// /lib/modules/*.ko it finds, in no useful order, before the guest's init
// runs.
const ModulesDir = "ovlkit/modules"

// ModuleOrderPath is the load order's file, relative to the root.
const ModuleOrderPath = ModulesDir + "/order"

// A Module of the load order: the module's name and its file in
// ModulesDir.
type Module struct {
	Name, File string
}

// EncodeModuleOrder gives the order file's text: one "NAME\tFILE" line a
// module, in load order.
func EncodeModuleOrder(mods []Module) string {
	var b strings.Builder
	for _, m := range mods {
		fmt.Fprintf(&b, "%s\t%s\n", m.Name, m.File)
	}
	return b.String()
}

// ParseModuleOrder reads what EncodeModuleOrder wrote. A file name must
// be a name in ModulesDir, not a path.
func ParseModuleOrder(text string) ([]Module, error) {
	var out []Module
	for _, line := range strings.Split(text, "\n") {
		if line == "" {
			continue
		}
		name, file, ok := strings.Cut(line, "\t")
		if !ok || name == "" || file == "" || strings.Contains(file, "/") {
			return nil, fmt.Errorf("module order line %q: want NAME<tab>FILE", line)
		}
		out = append(out, Module{Name: name, File: file})
	}
	return out, nil
}

// An Entry of the manifest is one test binary: its import path, the
// binary and the directory it runs in (the package directory, for its
// testdata), both absolute paths in the guest.
type Entry struct {
	Pkg, Binary, Dir string
}

// EncodeManifest gives the manifest's text: one line an entry, fields
// separated by tabs.
func EncodeManifest(entries []Entry) string {
	var b strings.Builder
	for _, e := range entries {
		fmt.Fprintf(&b, "%s\t%s\t%s\n", e.Pkg, e.Binary, e.Dir)
	}
	return b.String()
}

// ParseManifest reads what EncodeManifest wrote.
func ParseManifest(text string) ([]Entry, error) {
	var out []Entry
	for _, line := range strings.Split(text, "\n") {
		if line == "" {
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) != 3 {
			return nil, fmt.Errorf("manifest line %q: want 3 tab-separated fields", line)
		}
		out = append(out, Entry{Pkg: f[0], Binary: f[1], Dir: f[2]})
	}
	return out, nil
}

// A Writer writes records to the results console. It does not buffer and
// ignores write errors: when the console is gone the host has nobody to
// tell, and sees the run end early.
type Writer struct {
	W io.Writer
}

func (w Writer) record(kind string, args ...any) {
	fmt.Fprintf(w.W, "%s%s", Tag, kind)
	for _, a := range args {
		fmt.Fprint(w.W, " ", a)
	}
	fmt.Fprintln(w.W)
}

// Start opens the run with the kernel's release and version.
func (w Writer) Start(kernel string) { w.record(recStart, kernel) }

// Note reports a problem that did not stop the run.
func (w Writer) Note(msg string) { w.record(recNote, msg) }

// Error reports the problem that stopped the run.
func (w Writer) Error(err error) { w.record(recError, err) }

// Begin starts a test binary's output.
func (w Writer) Begin(pkg string) { w.record(recBegin, pkg) }

// End closes it with its exit code and run time. Output that ended
// without a newline is ended first, so the record starts a line.
func (w Writer) End(pkg string, code int, seconds float64) {
	fmt.Fprintln(w.W)
	w.record(recEnd, pkg, code, strconv.FormatFloat(seconds, 'f', 3, 64))
}

// BinaryNote reports a problem with a running binary, after output that
// may not have ended its line.
func (w Writer) BinaryNote(msg string) {
	fmt.Fprintln(w.W)
	w.Note(msg)
}

// KmsgBegin starts the kernel log: the lines that follow up to KmsgEnd are
// kernel log lines.
func (w Writer) KmsgBegin() { w.record(recKmsg) }

// KmsgEnd ends the kernel log.
func (w Writer) KmsgEnd() { w.record(recKmsgEnd) }

// Done ends the run: the guest got to its end.
func (w Writer) Done() { w.record(recDone) }

// A Run is what the guest sent over the results console.
type Run struct {
	Kernel   string // release and version of the guest kernel
	Binaries []Binary
	Kmsg     []string
	Done     bool     // the guest reached the end of its run
	Notes    []string // guest-side errors (exec failures, kmsg problems)
}

// A Binary is one test binary's output and how it ended.
type Binary struct {
	Pkg      string
	Output   []byte // raw -test.v=test2json output
	ExitCode int
	Seconds  float64
	Ended    bool
}

// Parse reads the results console stream. It never fails on truncated
// input: a guest that died mid-run leaves Done false and the last binary
// not Ended, which the caller reports.
func Parse(r io.Reader) (*Run, error) {
	p := parser{run: &Run{}}
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		// A console that still translates newlines sends CR LF.
		if strings.HasSuffix(line, "\r\n") {
			line = line[:len(line)-2] + "\n"
		}
		if line != "" {
			p.line(line)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return p.run, fmt.Errorf("read results: %w", err)
		}
	}
	if p.cur != nil {
		p.run.Binaries = append(p.run.Binaries, *p.cur)
	}
	return p.run, nil
}

type parser struct {
	run    *Run
	cur    *Binary // the binary whose output is coming, if any
	inKmsg bool
}

func (p *parser) line(line string) {
	i := strings.Index(line, Tag)
	if i < 0 {
		switch {
		case p.inKmsg:
			p.run.Kmsg = append(p.run.Kmsg, strings.TrimRight(line, "\n"))
		case p.cur != nil:
			p.cur.Output = append(p.cur.Output, line...)
		}
		return
	}
	// Output a test printed without a final newline precedes the tag.
	if i > 0 && p.cur != nil {
		p.cur.Output = append(p.cur.Output, line[:i]...)
	}
	rec := strings.Fields(strings.TrimSpace(line[i+len(Tag):]))
	if len(rec) == 0 {
		return
	}
	p.record(rec[0], rec[1:])
}

func (p *parser) record(kind string, args []string) {
	switch kind {
	case recStart:
		p.run.Kernel = strings.Join(args, " ")
	case recBegin:
		if p.cur != nil {
			p.run.Binaries = append(p.run.Binaries, *p.cur)
		}
		pkg := ""
		if len(args) > 0 {
			pkg = args[0]
		}
		p.cur = &Binary{Pkg: pkg}
	case recEnd:
		if p.cur != nil && len(args) >= 3 {
			p.cur.ExitCode, _ = strconv.Atoi(args[1])
			p.cur.Seconds, _ = strconv.ParseFloat(args[2], 64)
			p.cur.Ended = true
			p.run.Binaries = append(p.run.Binaries, *p.cur)
			p.cur = nil
		}
	case recKmsg:
		p.inKmsg = true
	case recKmsgEnd:
		p.inKmsg = false
	case recNote, recError:
		p.run.Notes = append(p.run.Notes, strings.Join(args, " "))
	case recDone:
		p.run.Done = true
	}
}
