package initramfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/ovlkit/ovlkit/vm/guestproto"
	"github.com/u-root/mkuimage/cpio"
)

// A distribution kernel comes as a Debian linux-image package: the kernel
// image in /boot and its modules in /lib/modules/RELEASE. The package is
// unpacked with dpkg-deb rather than read here (an ar archive holding a
// data.tar compressed with xz or zstd, depending on the release): dpkg-deb
// is on every Debian host, since dpkg needs it, and handles every format
// Debian has used. modules.dep is not in the package (the package's
// postinst runs depmod), so depmod -b writes it into the unpacked tree.

// completeStamp marks a fully unpacked and indexed package directory;
// scripts/distro-kernel.sh writes the same file.
const completeStamp = ".ovlkit-complete"

// DistroDir is where unpacked kernel packages live in the cache, one
// directory PACKAGE_VERSION each (shared with scripts/distro-kernel.sh).
func DistroDir(cache string) string { return filepath.Join(cache, "distro") }

// ExtractDeb unpacks a linux-image .deb into the cache, once per package
// and version, runs depmod for each module tree it holds, and returns the
// directory (the package's root: boot/, lib/modules/).
func ExtractDeb(ctx context.Context, deb, cache string) (string, error) {
	out, err := exec.CommandContext(ctx, "dpkg-deb", "-f", deb, "Package", "Version").Output()
	if err != nil {
		return "", fmt.Errorf("dpkg-deb -f %s: %w", deb, exitDetail(err))
	}
	var pkg, ver string
	for _, line := range strings.Split(string(out), "\n") {
		k, v, _ := strings.Cut(line, ":")
		switch strings.TrimSpace(k) {
		case "Package":
			pkg = strings.TrimSpace(v)
		case "Version":
			ver = strings.TrimSpace(v)
		}
	}
	if pkg == "" || ver == "" {
		return "", fmt.Errorf("%s: no Package or Version in its control file", deb)
	}
	root := filepath.Join(DistroDir(cache), pkg+"_"+ver)
	if _, err := os.Stat(filepath.Join(root, completeStamp)); err == nil {
		return root, nil
	}
	if err := os.MkdirAll(DistroDir(cache), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(DistroDir(cache), ".extract-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, tmp).CombinedOutput(); err != nil {
		return "", fmt.Errorf("dpkg-deb -x %s: %v: %s", deb, err, bytes.TrimSpace(out))
	}
	releases, err := filepath.Glob(filepath.Join(tmp, "lib", "modules", "*"))
	if err != nil {
		return "", err
	}
	depmod, err := lookSbin("depmod")
	if err != nil {
		return "", err
	}
	for _, r := range releases {
		rel := filepath.Base(r)
		if out, err := exec.CommandContext(ctx, depmod, "-b", tmp, rel).CombinedOutput(); err != nil {
			return "", fmt.Errorf("depmod -b %s %s: %v: %s", tmp, rel, err, bytes.TrimSpace(out))
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, completeStamp), []byte(pkg+" "+ver+"\n"), 0o644); err != nil {
		return "", err
	}
	// An earlier, interrupted unpack has no stamp; replace it.
	if err := os.RemoveAll(root); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, root); err != nil {
		return "", err
	}
	return root, nil
}

// lookSbin finds a tool that lives in /sbin or /usr/sbin, which a
// non-login root shell may not have on PATH.
func lookSbin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found (install kmod)", name)
}

func exitDetail(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%v: %s", err, bytes.TrimSpace(ee.Stderr))
	}
	return err
}

// FindPackageKernel returns the kernel image and module directory of an
// unpacked linux-image package (ExtractDeb, scripts/distro-kernel.sh).
func FindPackageKernel(root string) (kernel, modules string, err error) {
	imgs, err := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if err != nil {
		return "", "", err
	}
	if len(imgs) != 1 {
		return "", "", fmt.Errorf("%s: want one boot/vmlinuz-*, found %d", root, len(imgs))
	}
	rel := strings.TrimPrefix(filepath.Base(imgs[0]), "vmlinuz-")
	modules = filepath.Join(root, "lib", "modules", rel)
	if _, err := os.Stat(modules); err != nil {
		return "", "", fmt.Errorf("%s has no modules for %s: %w", root, rel, err)
	}
	return imgs[0], modules, nil
}

// ModulesDir finds the module directory for kernel release rel from what
// the user gave: a linux-image .deb (unpacked into the cache), an
// unpacked package or root directory (ROOT/lib/modules/REL), a modules
// directory holding release directories (/lib/modules), or a release
// directory itself.
func ModulesDir(ctx context.Context, arg, rel, cache string) (string, error) {
	fi, err := os.Stat(arg)
	if err != nil {
		return "", fmt.Errorf("-modules: %w", err)
	}
	if !fi.IsDir() {
		if !strings.HasSuffix(arg, ".deb") {
			return "", fmt.Errorf("-modules %s: want a directory or a linux-image .deb", arg)
		}
		root, err := ExtractDeb(ctx, arg, cache)
		if err != nil {
			return "", err
		}
		arg = root
	}
	for _, d := range []string{filepath.Join(arg, "lib", "modules", rel), filepath.Join(arg, rel)} {
		if _, err := os.Stat(d); err == nil {
			return d, nil
		}
	}
	if filepath.Base(arg) == rel || exists(filepath.Join(arg, "modules.order")) || exists(filepath.Join(arg, "modules.dep")) {
		return arg, nil
	}
	have, _ := filepath.Glob(filepath.Join(arg, "lib", "modules", "*"))
	return "", fmt.Errorf("-modules %s: no modules for kernel release %s (has: %s)", arg, rel, strings.Join(baseNames(have), ", "))
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func baseNames(ps []string) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = filepath.Base(p)
	}
	return out
}

// PrepareModules resolves the modules the guest suite needs for kernel
// (a bzImage) from modulesArg (see ModulesDir). The kernel's release must
// be the modules' release: the kernel refuses modules built for another.
func PrepareModules(ctx context.Context, kernel, modulesArg, cache string) (*ModuleSet, error) {
	f, err := os.Open(kernel)
	if err != nil {
		return nil, err
	}
	head := make([]byte, 64<<10)
	n, err := io.ReadFull(f, head)
	f.Close()
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("read %s: %w", kernel, err)
	}
	rel, err := KernelRelease(head[:n])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", kernel, err)
	}
	dir, err := ModulesDir(ctx, modulesArg, rel, cache)
	if err != nil {
		return nil, err
	}
	ix, err := LoadModuleIndex(dir)
	if err != nil {
		return nil, err
	}
	plan, err := ix.Resolve(GuestModules)
	if err != nil {
		return nil, err
	}
	set := &ModuleSet{Release: rel, Index: ix, Plan: plan, InKernel: map[string]bool{}}
	// The build configuration sits next to the image in a package or
	// an installed system: ROOT/boot/config-REL for ROOT/lib/modules/REL.
	for _, c := range []string{
		filepath.Join(dir, "..", "..", "..", "boot", "config-"+rel),
		filepath.Join(filepath.Dir(kernel), "config-"+rel),
	} {
		if b, err := os.ReadFile(c); err == nil {
			set.InKernel = KernelDecompresses(string(b))
			break
		}
	}
	return set, nil
}

// Describe says in one line what will be loaded.
func (s *ModuleSet) Describe() string {
	how := "unpacked on the host"
	if len(s.InKernel) > 0 {
		how = "the kernel unpacks " + strings.Join(sortedKeys(s.InKernel), ",")
	}
	msg := fmt.Sprintf("modules for %s: %d to load (%s)", s.Release, len(s.Plan.Load), how)
	if len(s.Plan.Builtin) > 0 {
		msg += ", built in: " + strings.Join(s.Plan.Builtin, ",")
	}
	if len(s.Plan.Absent) > 0 {
		msg += ", absent: " + strings.Join(s.Plan.Absent, ",")
	}
	return msg
}

// writeModulesCPIO writes a newc archive with the modules of s, in load
// order, and the list ovlinit loads them from.
func writeModulesCPIO(ctx context.Context, w io.Writer, s *ModuleSet) error {
	files := s.PackList()
	recs := []cpio.Record{cpio.Directory("ovlkit", 0o755), cpio.Directory(guestproto.ModulesDir, 0o755)}
	for _, f := range files {
		b, err := readModule(ctx, f)
		if err != nil {
			return err
		}
		recs = append(recs, cpio.StaticRecord(b, cpio.Info{Name: guestproto.ModulesDir + "/" + f.Guest, Mode: 0o100644}))
	}
	recs = append(recs, cpio.StaticFile(guestproto.ModuleOrderPath, LoadOrderFile(files), 0o644))
	cw := cpio.Newc.Writer(w)
	if err := cpio.WriteRecords(cw, recs); err != nil {
		return fmt.Errorf("write modules cpio: %w", err)
	}
	return cpio.WriteTrailer(cw)
}

// readModule reads a module file, unpacking it with the compressor's own
// tool when the kernel cannot (xz-utils is on every Debian system; zstd
// and gzip where those compressions are in use).
func readModule(ctx context.Context, f ModuleFile) ([]byte, error) {
	if f.Unpack == "" {
		b, err := os.ReadFile(f.Source)
		if err != nil {
			return nil, fmt.Errorf("module %s: %w", f.Name, err)
		}
		return b, nil
	}
	tool := map[string]string{"xz": "xz", "zst": "zstd", "gz": "gzip"}[f.Unpack]
	out, err := exec.CommandContext(ctx, tool, "-dc", f.Source).Output()
	if err != nil {
		return nil, fmt.Errorf("unpack module %s with %s: %w", f.Source, tool, exitDetail(err))
	}
	return out, nil
}
