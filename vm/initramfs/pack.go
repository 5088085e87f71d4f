// Package initramfs makes what a guest boots besides its kernel: the
// u-root core image with the guest's init (cached by content), the test
// binaries built on the host with their testdata and manifest, and, for a
// kernel whose drivers are modules (a distribution kernel), the modules
// the guest needs, resolved from depmod's files and packed in load order.
package initramfs

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/u-root/mkuimage/cpio"

	"github.com/ovlkit/ovlkit/vm/guestproto"
)

// GuestTag is the build tag of guest-only test packages.
const GuestTag = "ovlkit_guest"

// A Package is one guest test binary built on the host.
type Package struct {
	ImportPath string
	Binary     string // host path of the compiled test binary
	Dir        string // host package directory (its testdata/ goes along)
}

// ListGuestPackages resolves package patterns (e.g. ./tests/guest/...) in
// moduleDir to the packages that have tests.
func ListGuestPackages(ctx context.Context, goBin, moduleDir string, patterns ...string) ([]Package, error) {
	args := append([]string{"list", "-tags", GuestTag, "-f",
		"{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}\t{{.Dir}}{{end}}"}, patterns...)
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = moduleDir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %v: %s", strings.Join(patterns, " "), err, strings.TrimSpace(stderr.String()))
	}
	var pkgs []Package
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		ip, dir, _ := strings.Cut(line, "\t")
		pkgs = append(pkgs, Package{ImportPath: ip, Dir: dir})
	}
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("no test packages match %s", strings.Join(patterns, " "))
	}
	return pkgs, nil
}

// BuildTests compiles each package's test binary into outDir. The binaries
// are static (CGO_ENABLED=0): the guest has no C library.
func BuildTests(ctx context.Context, goBin, moduleDir, outDir string, pkgs []Package) error {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	for i := range pkgs {
		p := &pkgs[i]
		name := strings.NewReplacer("/", "_", ".", "_").Replace(p.ImportPath) + ".test"
		p.Binary = filepath.Join(outDir, name)
		cmd := exec.CommandContext(ctx, goBin, "test", "-c", "-tags", GuestTag,
			"-o", p.Binary, p.ImportPath)
		cmd.Dir = moduleDir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("build test binary for %s: %v\n%s", p.ImportPath, err, out)
		}
	}
	return nil
}

// A File is a host file put into the guest at an absolute path, with the
// host file's permission bits: a program the guest tests run, such as a
// container runtime, that is neither a test binary nor in the core image.
type File struct {
	Host  string // host path
	Guest string // absolute, clean guest path
}

// ParseFile parses HOST=GUEST, as ovlvm's -file flag takes it.
func ParseFile(s string) (File, error) {
	host, guest, ok := strings.Cut(s, "=")
	if !ok || host == "" || guest == "" {
		return File{}, fmt.Errorf("%q: want HOST=GUEST", s)
	}
	if !path.IsAbs(guest) || path.Clean(guest) != guest || guest == "/" {
		return File{}, fmt.Errorf("%q: the guest path must be absolute and clean, and not /", s)
	}
	if guest == "/ovlkit" || strings.HasPrefix(guest, "/ovlkit/") {
		return File{}, fmt.Errorf("%q: /ovlkit holds the test binaries and their manifest", s)
	}
	return File{Host: host, Guest: guest}, nil
}

// writeTestsCPIO writes a newc archive with the test binaries, their
// testdata directories, the extra files and the manifest ovlinit reads.
func writeTestsCPIO(w io.Writer, pkgs []Package, files []File) error {
	cw := cpio.Newc.Writer(w)
	var recs []cpio.Record
	var manifest []guestproto.Entry
	dirs := map[string]bool{}
	addDirs := func(p string) {
		for d := path.Dir(p); d != "." && d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for _, p := range pkgs {
		bin, err := os.ReadFile(p.Binary)
		if err != nil {
			return fmt.Errorf("read %s: %w", p.Binary, err)
		}
		name := "ovlkit/bin/" + filepath.Base(p.Binary)
		addDirs(name)
		recs = append(recs, cpio.StaticRecord(bin, cpio.Info{Name: name, Mode: 0o100755}))
		wd := "ovlkit/pkg/" + p.ImportPath
		addDirs(wd + "/x")
		td := filepath.Join(p.Dir, "testdata")
		if fi, err := os.Stat(td); err == nil && fi.IsDir() {
			err := filepath.Walk(td, func(hp string, fi os.FileInfo, err error) error {
				if err != nil {
					return err
				}
				rel, _ := filepath.Rel(p.Dir, hp)
				gp := wd + "/" + filepath.ToSlash(rel)
				switch {
				case fi.IsDir():
					dirs[gp] = true
				case fi.Mode().IsRegular():
					b, err := os.ReadFile(hp)
					if err != nil {
						return err
					}
					addDirs(gp)
					recs = append(recs, cpio.StaticRecord(b, cpio.Info{Name: gp, Mode: 0o100000 | uint64(fi.Mode().Perm())}))
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("pack testdata of %s: %w", p.ImportPath, err)
			}
		}
		manifest = append(manifest, guestproto.Entry{Pkg: p.ImportPath, Binary: "/" + name, Dir: "/" + wd})
	}
	for _, f := range files {
		fi, err := os.Stat(f.Host)
		if err != nil {
			return fmt.Errorf("extra file for %s: %w", f.Guest, err)
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("extra file for %s: %s is not a regular file", f.Guest, f.Host)
		}
		b, err := os.ReadFile(f.Host)
		if err != nil {
			return fmt.Errorf("extra file for %s: %w", f.Guest, err)
		}
		name := strings.TrimPrefix(f.Guest, "/")
		addDirs(name)
		recs = append(recs, cpio.StaticRecord(b, cpio.Info{Name: name, Mode: 0o100000 | uint64(fi.Mode().Perm())}))
	}
	recs = append(recs, cpio.StaticFile(guestproto.ManifestPath, guestproto.EncodeManifest(manifest), 0o644))
	dirList := make([]string, 0, len(dirs))
	for d := range dirs {
		dirList = append(dirList, d)
	}
	sort.Strings(dirList)
	var all []cpio.Record
	for _, d := range dirList {
		all = append(all, cpio.Directory(d, 0o755))
	}
	all = append(all, recs...)
	if err := cpio.WriteRecords(cw, all); err != nil {
		return fmt.Errorf("write tests cpio: %w", err)
	}
	return cpio.WriteTrailer(cw)
}

// Write concatenates the cached core image, the tests archive (with the
// extra files) and, for a kernel with modules, the modules archive. The kernel unpacks
// concatenated newc archives in order; the padding keeps each following
// archive 4-byte aligned as the unpacker requires.
func Write(ctx context.Context, dst, core string, pkgs []Package, files []File, mods *ModuleSet) error {
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer f.Close()
	c, err := os.Open(core)
	if err != nil {
		return fmt.Errorf("open initramfs %s: %w", core, err)
	}
	defer c.Close()
	n, err := io.Copy(f, c)
	if err != nil {
		return fmt.Errorf("copy initramfs: %w", err)
	}
	if err := pad512(f, n); err != nil {
		return err
	}
	if err := writeTestsCPIO(f, pkgs, files); err != nil {
		return err
	}
	if mods != nil {
		end, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			return err
		}
		if err := pad512(f, end); err != nil {
			return err
		}
		if err := writeModulesCPIO(ctx, f, mods); err != nil {
			return err
		}
	}
	return f.Close()
}

func pad512(w io.Writer, n int64) error {
	if pad := (512 - n%512) % 512; pad > 0 {
		if _, err := w.Write(make([]byte, pad)); err != nil {
			return err
		}
	}
	return nil
}

// NestedWorkspace finds the go.work of a nested module that a package
// pattern points into (the benchmark module keeps its peers' dependencies
// out of the main go.mod and is built through its own workspace), or ""
// when every pattern is in the main module. Patterns are relative to top,
// as "./bench" or "./bench/...".
func NestedWorkspace(top string, patterns []string) (string, error) {
	found := ""
	for _, p := range patterns {
		if !strings.HasPrefix(p, "./") {
			continue
		}
		dir := filepath.Join(top, strings.TrimSuffix(strings.TrimSuffix(p, "..."), "/"))
		for d := dir; d != top && strings.HasPrefix(d, top+string(filepath.Separator)); d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err != nil {
				continue
			}
			work := filepath.Join(d, "go.work")
			if _, err := os.Stat(work); err != nil {
				return "", fmt.Errorf("%s is a separate module without a go.work to build it from %s", d, top)
			}
			if found != "" && found != work {
				return "", fmt.Errorf("patterns span two nested modules (%s and %s)", found, work)
			}
			found = work
			break
		}
	}
	return found, nil
}
