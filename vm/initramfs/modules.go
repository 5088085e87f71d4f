package initramfs

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ovlkit/ovlkit/vm/guestproto"
)

// A kernel whose drivers are modules (a distribution's kernel, unlike the
// minimal builds with everything built in) needs some of them loaded before
// the guest can reach its disks, its results console or an overlay mount.
// The host resolves what to load from depmod's index files and packs only
// those modules, in load order, into the initramfs; the guest's init loads
// them first thing (initramfs/ovlinit).

// GuestModule is a module (or module alias) the guest suite needs.
type GuestModule struct {
	Name string
	// Optional modules are loaded when the kernel has them; a required
	// one that is neither a module nor built in stops the run before
	// boot.
	Optional bool
	Why      string
}

// GuestModules is what the suite needs from a modular kernel: the virtio
// devices QEMU attaches, every filesystem a scratch or refusal disk can
// carry, overlayfs, and FUSE for the FUSE-lower suite. All are packed
// whatever -fs says, so the guest's /proc/filesystems does not depend on
// which disks a run attaches.
var GuestModules = []GuestModule{
	{Name: "virtio_pci", Why: "the virtio devices QEMU attaches"},
	{Name: "virtio_console", Why: "the results channel, /dev/hvc0"},
	{Name: "virtio_blk", Why: "the scratch disks"},
	{Name: "overlay", Why: "the filesystem under test"},
	{Name: "ext4", Why: "ext4 scratch disk"},
	{Name: "xfs", Why: "xfs and xfs ftype=0 disks"},
	{Name: "btrfs", Why: "btrfs scratch disk"},
	{Name: "vfat", Why: "FAT refusal disk"},
	{Name: "fuse", Why: "FUSE lower layers (tests/guest/fuselower)"},
	// FAT's default codepage and I/O charset (FAT_DEFAULT_CODEPAGE,
	// FAT_DEFAULT_IOCHARSET) are loaded on mount through request_module,
	// and the guest has no modprobe for the kernel to call: load the
	// usual ones up front.
	{Name: "nls_cp437", Optional: true, Why: "FAT default codepage"},
	{Name: "nls_ascii", Optional: true, Why: "FAT default I/O charset"},
	{Name: "nls_utf8", Optional: true, Why: "FAT utf8 I/O charset"},
	{Name: "nls_iso8859_1", Optional: true, Why: "FAT iso8859-1 I/O charset"},
	// Checksum algorithms are found through the crypto API, which also
	// asks for modules by alias; softdeps name most of them, this one
	// is what ext4, jbd2, xfs and btrfs all use.
	{Name: "crypto-crc32c", Optional: true, Why: "metadata checksums"},
	{Name: "loop", Optional: true, Why: "loop devices"},
	{Name: "lkdtm", Optional: true, Why: "the harness self-test's injected WARN and panic"},
}

// ModName is the module name of a module file path: its base name without
// .ko and any compression suffix, dashes turned to underscores as the
// kernel and modprobe do.
func ModName(p string) string {
	b := path.Base(filepath.ToSlash(p))
	if i := strings.Index(b, ".ko"); i >= 0 {
		b = b[:i]
	}
	return strings.ReplaceAll(b, "-", "_")
}

// ModuleIndex is depmod's view of one kernel's modules: the files under
// /lib/modules/RELEASE that modprobe reads.
type ModuleIndex struct {
	Dir string // /lib/modules/RELEASE
	// Deps maps a module's path relative to Dir to the paths of every
	// module it needs (modules.dep lists the whole closure).
	Deps   map[string][]string
	byName map[string]string
	// Builtin holds the names of modules built into the kernel image.
	Builtin map[string]bool
	// Aliases maps an exact alias (no wildcards) to module names, built
	// in or not.
	Aliases map[string][]string
	// Softdeps maps a module name to the modules or aliases to load
	// before it ("pre:" of modules.softdep).
	Softdeps map[string][]string
}

// ParseModulesDep reads modules.dep: "path: dep dep ...", one module a line.
func ParseModulesDep(r io.Reader) (map[string][]string, error) {
	deps := map[string][]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		mod, rest, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(mod) == "" {
			return nil, fmt.Errorf("modules.dep line %d: %q: want \"path: deps\"", n, line)
		}
		deps[strings.TrimSpace(mod)] = strings.Fields(rest)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read modules.dep: %w", err)
	}
	return deps, nil
}

// ParseModulesAlias reads modules.alias ("alias NAME MODULE"), keeping only
// exact aliases: the wildcard ones match devices, which the kernel binds
// to drivers itself once the driver is loaded.
func ParseModulesAlias(r io.Reader, into map[string][]string) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 || f[0] != "alias" || strings.ContainsAny(f[1], "*?[") {
			continue
		}
		into[f[1]] = appendUnique(into[f[1]], ModName(f[2]))
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read modules.alias: %w", err)
	}
	return nil
}

// ParseModulesSoftdep reads modules.softdep: "softdep MOD pre: A B post: C".
// Only "pre:" matters here; words before any "pre:" or "post:" are not
// valid softdep syntax and modprobe ignores them too.
func ParseModulesSoftdep(r io.Reader) (map[string][]string, error) {
	out := map[string][]string{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "softdep" {
			continue
		}
		mod := ModName(f[1])
		section := ""
		for _, w := range f[2:] {
			switch w {
			case "pre:", "post:":
				section = w
			default:
				if section == "pre:" {
					out[mod] = appendUnique(out[mod], w)
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read modules.softdep: %w", err)
	}
	return out, nil
}

// ParseBuiltinModinfo reads modules.builtin.modinfo (NUL-separated
// "module.key=value" strings) for the aliases of built-in modules, so
// that an alias a built-in module provides counts as present.
func ParseBuiltinModinfo(b []byte, into map[string][]string) {
	for _, rec := range bytes.Split(b, []byte{0}) {
		mod, kv, ok := strings.Cut(string(rec), ".")
		if !ok {
			continue
		}
		if alias, ok := strings.CutPrefix(kv, "alias="); ok && !strings.ContainsAny(alias, "*?[") {
			into[alias] = appendUnique(into[alias], ModName(mod))
		}
	}
}

func appendUnique(list []string, s string) []string {
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(list, s)
}

// LoadModuleIndex reads depmod's files in dir (/lib/modules/RELEASE).
// modules.dep is required: a linux-image package does not ship it, depmod
// writes it when the package is installed (ExtractDeb runs depmod).
func LoadModuleIndex(dir string) (*ModuleIndex, error) {
	ix := &ModuleIndex{Dir: dir, byName: map[string]string{}, Builtin: map[string]bool{}, Aliases: map[string][]string{}}
	f, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("module index: %w (run depmod -b ROOT RELEASE first)", err)
	}
	ix.Deps, err = ParseModulesDep(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	for p := range ix.Deps {
		ix.byName[ModName(p)] = p
	}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		for _, line := range strings.Fields(string(b)) {
			ix.Builtin[ModName(line)] = true
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin.modinfo")); err == nil {
		ParseBuiltinModinfo(b, ix.Aliases)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if f, err := os.Open(filepath.Join(dir, "modules.alias")); err == nil {
		err = ParseModulesAlias(f, ix.Aliases)
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	ix.Softdeps = map[string][]string{}
	if f, err := os.Open(filepath.Join(dir, "modules.softdep")); err == nil {
		ix.Softdeps, err = ParseModulesSoftdep(f)
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	return ix, nil
}

// A ModulePlan is what to load in the guest, dependencies first.
type ModulePlan struct {
	Load    []string // module paths relative to the index's Dir, in load order
	Builtin []string // wanted modules the kernel has built in
	Absent  []string // optional modules (or softdeps) the kernel has not got
}

// Names returns the module names of Load.
func (p *ModulePlan) Names() []string {
	out := make([]string, len(p.Load))
	for i, l := range p.Load {
		out[i] = ModName(l)
	}
	return out
}

// lookup resolves a module name or alias to module paths to load and
// whether it is (also) built in. ok is false when the kernel has neither.
func (ix *ModuleIndex) lookup(name string) (paths []string, builtin, ok bool) {
	mod := ModName(name)
	if ix.Builtin[mod] {
		return nil, true, true
	}
	if p, found := ix.byName[mod]; found {
		return []string{p}, false, true
	}
	// An alias may name several modules (crc32c: the generic one and the
	// CPU-accelerated ones); modprobe loads them all, and so does this.
	targets := ix.Aliases[name]
	for _, t := range targets {
		if ix.Builtin[t] {
			builtin = true
		} else if p, found := ix.byName[t]; found {
			paths = append(paths, p)
		}
	}
	return paths, builtin, builtin || len(paths) > 0
}

// Resolve turns the wanted modules into a load order. Each module comes
// after everything modules.dep lists for it and after its softdeps;
// modules.dep already lists the whole closure, the walk only orders it.
// A required module the kernel has neither built in nor as a module is an
// error; softdeps and optional modules that are missing are noted in
// Absent, as modprobe skips a missing softdep.
func (ix *ModuleIndex) Resolve(want []GuestModule) (*ModulePlan, error) {
	plan := &ModulePlan{}
	state := map[string]int{} // 1: being visited, 2: done
	var missing []string
	var visit func(p string, chain []string) error
	visitName := func(name string, optional bool, chain []string) error {
		paths, builtin, ok := ix.lookup(name)
		switch {
		case !ok && optional:
			plan.Absent = appendUnique(plan.Absent, name)
			return nil
		case !ok:
			missing = append(missing, name)
			return nil
		case builtin && len(paths) == 0:
			plan.Builtin = appendUnique(plan.Builtin, name)
		}
		for _, p := range paths {
			if err := visit(p, chain); err != nil {
				return err
			}
		}
		return nil
	}
	visit = func(p string, chain []string) error {
		switch state[p] {
		case 2:
			return nil
		case 1:
			return fmt.Errorf("module dependency cycle: %s -> %s", strings.Join(chain, " -> "), ModName(p))
		}
		state[p] = 1
		chain = append(chain, ModName(p))
		for _, s := range ix.Softdeps[ModName(p)] {
			if err := visitName(s, true, chain); err != nil {
				return err
			}
		}
		deps, ok := ix.Deps[p]
		if !ok {
			return fmt.Errorf("%s: modules.dep names %s, which has no entry of its own", strings.Join(chain, " -> "), p)
		}
		for _, d := range deps {
			if err := visit(d, chain); err != nil {
				return err
			}
		}
		state[p] = 2
		plan.Load = append(plan.Load, p)
		return nil
	}
	for _, w := range want {
		if err := visitName(w.Name, w.Optional, nil); err != nil {
			return nil, err
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("kernel modules in %s: %s neither built in nor a module", ix.Dir, strings.Join(missing, ", "))
	}
	return plan, nil
}

// compressionOf names the compression of a module file by its suffix, ""
// for a plain .ko.
func compressionOf(p string) string {
	for _, c := range []string{"xz", "zst", "gz"} {
		if strings.HasSuffix(p, ".ko."+c) {
			return c
		}
	}
	return ""
}

// KernelDecompresses reports which module compressions the kernel can
// unpack itself (finit_module's MODULE_INIT_COMPRESSED_FILE), from its
// build configuration: MODULE_DECOMPRESS handles the one algorithm the
// kernel's modules were compressed with.
func KernelDecompresses(config string) map[string]bool {
	out := map[string]bool{}
	if !strings.Contains(config, "\nCONFIG_MODULE_DECOMPRESS=y") {
		return out
	}
	for sym, c := range map[string]string{
		"CONFIG_MODULE_COMPRESS_XZ=y": "xz", "CONFIG_MODULE_COMPRESS_ZSTD=y": "zst", "CONFIG_MODULE_COMPRESS_GZIP=y": "gz",
	} {
		if strings.Contains(config, "\n"+sym) {
			out[c] = true
		}
	}
	return out
}

// KernelRelease reads the release string ("6.1.0-57-amd64") of an x86
// bzImage from its setup header: the kernel_version field at 0x20e points
// at a NUL-terminated "RELEASE (builder) #1 ..." 0x200 bytes further on.
func KernelRelease(img []byte) (string, error) {
	if len(img) < 0x210 || string(img[0x202:0x206]) != "HdrS" {
		return "", errors.New("not an x86 bzImage (no HdrS setup header)")
	}
	off := int(binary.LittleEndian.Uint16(img[0x20e:])) + 0x200
	if off == 0x200 || off >= len(img) {
		return "", errors.New("bzImage has no kernel version string")
	}
	s := img[off:]
	if i := bytes.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	f := strings.Fields(string(s))
	if len(f) == 0 {
		return "", errors.New("bzImage has an empty kernel version string")
	}
	return f[0], nil
}

// A ModuleSet is a kernel's resolved modules, ready to pack.
type ModuleSet struct {
	Release string
	Index   *ModuleIndex
	Plan    *ModulePlan
	// InKernel lists the compressions the kernel unpacks itself; other
	// compressed modules are unpacked on the host when packing.
	InKernel map[string]bool
}

// ModuleFile is one module as packed for the guest.
type ModuleFile struct {
	Name   string // module name
	Source string // host path
	Guest  string // file name in guestproto.ModulesDir
	// Unpack is the compression the host removes while packing ("" when
	// the file is packed as it is).
	Unpack string
}

// PackList names the files to pack, numbered in load order. A compressed
// module keeps its suffix when the kernel unpacks it (the guest passes
// MODULE_INIT_COMPRESSED_FILE for it) and loses it otherwise.
func (s *ModuleSet) PackList() []ModuleFile {
	out := make([]ModuleFile, 0, len(s.Plan.Load))
	for i, p := range s.Plan.Load {
		f := ModuleFile{Name: ModName(p), Source: filepath.Join(s.Index.Dir, filepath.FromSlash(p))}
		suffix := ".ko"
		if c := compressionOf(p); c != "" {
			if s.InKernel[c] {
				suffix += "." + c
			} else {
				f.Unpack = c
			}
		}
		f.Guest = fmt.Sprintf("%03d-%s%s", i, f.Name, suffix)
		out = append(out, f)
	}
	return out
}

// LoadOrderFile is the guest's list of files, in load order.
func LoadOrderFile(files []ModuleFile) string {
	mods := make([]guestproto.Module, len(files))
	for i, f := range files {
		mods[i] = guestproto.Module{Name: f.Name, File: f.Guest}
	}
	return guestproto.EncodeModuleOrder(mods)
}

// sortedKeys is for stable messages.
func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
