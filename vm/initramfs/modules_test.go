package initramfs

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/u-root/mkuimage/cpio"
)

// fakeModules writes a depmod-style tree for release rel under
// root/lib/modules/rel, shaped after Debian's 6.1 kernel: virtio_pci with
// its helpers, ext4 with a softdep on the crc32c alias that two modules
// provide, a built-in sha256 and a module file named with dashes.
func fakeModules(t *testing.T, root, rel string) string {
	t.Helper()
	dir := filepath.Join(root, "lib", "modules", rel)
	files := map[string]string{
		"modules.dep": `kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/char/virtio_console.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko kernel/fs/mbcache.ko kernel/fs/jbd2/jbd2.ko
kernel/lib/crc16.ko:
kernel/fs/mbcache.ko:
kernel/fs/jbd2/jbd2.ko:
kernel/crypto/crc32c_generic.ko:
kernel/arch/x86/crypto/crc32c-intel.ko:
kernel/fs/overlayfs/overlay.ko:
`,
		"modules.softdep": "# Soft dependencies extracted from modules themselves.\n" +
			"softdep ext4 pre: crypto-crc32c\nsoftdep jbd2 pre: crypto-crc32c\nsoftdep cifs gcm\nsoftdep ext4 pre: sha256 post: crc16\n",
		"modules.alias": "alias crypto-crc32c crc32c_intel\nalias crypto-crc32c crc32c_generic\n" +
			"alias fs-ext4 ext4\nalias virtio:d00000003v* virtio_console\n",
		"modules.builtin":                                "kernel/crypto/sha256_generic.ko\nkernel/mm/tmpfs.ko\n",
		"modules.builtin.modinfo":                        "sha256_generic.alias=crypto-sha256\x00sha256_generic.alias=sha256\x00sha256_generic.license=GPL\x00",
		"kernel/drivers/virtio/virtio_pci.ko":            "virtio_pci",
		"kernel/drivers/virtio/virtio_pci_modern_dev.ko": "modern",
		"kernel/drivers/virtio/virtio.ko":                "virtio",
		"kernel/drivers/virtio/virtio_ring.ko":           "ring",
		"kernel/drivers/char/virtio_console.ko":          "console",
		"kernel/fs/ext4/ext4.ko":                         "ext4",
		"kernel/lib/crc16.ko":                            "crc16",
		"kernel/fs/mbcache.ko":                           "mbcache",
		"kernel/fs/jbd2/jbd2.ko":                         "jbd2",
		"kernel/crypto/crc32c_generic.ko":                "crc32c",
		"kernel/arch/x86/crypto/crc32c-intel.ko":         "crc32c-intel",
		"kernel/fs/overlayfs/overlay.ko":                 "overlay",
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestModName(t *testing.T) {
	for in, want := range map[string]string{
		"kernel/arch/x86/crypto/crc32c-intel.ko": "crc32c_intel",
		"kernel/fs/overlayfs/overlay.ko.xz":      "overlay",
		"nls_iso8859-1.ko.zst":                   "nls_iso8859_1",
		"virtio_pci":                             "virtio_pci",
	} {
		if got := ModName(in); got != want {
			t.Errorf("ModName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseModulesDepRejectsGarbage(t *testing.T) {
	if _, err := ParseModulesDep(strings.NewReader("kernel/a.ko: kernel/b.ko\nnot a dep line\n")); err == nil {
		t.Error("a line without a colon was accepted")
	}
}

func TestParseModulesSoftdepOnlyPre(t *testing.T) {
	got, err := ParseModulesSoftdep(strings.NewReader("softdep ext4 pre: a b post: c\nsoftdep cifs gcm\nsoftdep crc32c-intel pre: d\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"ext4": {"a", "b"}, "crc32c_intel": {"d"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("softdeps = %v, want %v", got, want)
	}
}

func TestResolveOrdersDependenciesFirst(t *testing.T) {
	ix, err := LoadModuleIndex(fakeModules(t, t.TempDir(), "6.1.0-57-amd64"))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := ix.Resolve([]GuestModule{
		{Name: "virtio_pci"}, {Name: "virtio_console"}, {Name: "ext4"}, {Name: "overlay"},
		{Name: "tmpfs"}, {Name: "lkdtm", Optional: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	names := plan.Names()
	pos := map[string]int{}
	for i, n := range names {
		if _, dup := pos[n]; dup {
			t.Errorf("%s loaded twice: %v", n, names)
		}
		pos[n] = i
	}
	before := [][2]string{
		{"virtio_ring", "virtio"}, {"virtio", "virtio_pci"}, {"virtio_pci_modern_dev", "virtio_pci"},
		{"virtio", "virtio_console"}, {"crc16", "ext4"}, {"mbcache", "ext4"}, {"jbd2", "ext4"},
		// softdep: the crc32c alias names both modules; both load before jbd2.
		{"crc32c_intel", "jbd2"}, {"crc32c_generic", "jbd2"},
	}
	for _, b := range before {
		i, ok1 := pos[b[0]]
		j, ok2 := pos[b[1]]
		if !ok1 || !ok2 || i > j {
			t.Errorf("%s must load before %s: %v", b[0], b[1], names)
		}
	}
	if len(names) != 12 {
		t.Errorf("loads %d modules, want the 12 modules of the tree: %v", len(names), names)
	}
	// sha256 is ext4's softdep and built in (by its alias); tmpfs is
	// built in by name; neither is loaded, lkdtm is absent.
	if !reflect.DeepEqual(plan.Builtin, []string{"tmpfs", "sha256"}) && !reflect.DeepEqual(plan.Builtin, []string{"sha256", "tmpfs"}) {
		t.Errorf("built in = %v, want sha256 and tmpfs", plan.Builtin)
	}
	if !reflect.DeepEqual(plan.Absent, []string{"lkdtm"}) {
		t.Errorf("absent = %v, want [lkdtm]", plan.Absent)
	}
}

func TestResolveRequiredMissing(t *testing.T) {
	ix, err := LoadModuleIndex(fakeModules(t, t.TempDir(), "r"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = ix.Resolve([]GuestModule{{Name: "overlay"}, {Name: "btrfs"}, {Name: "xfs"}})
	if err == nil || !strings.Contains(err.Error(), "btrfs, xfs neither built in nor a module") {
		t.Errorf("Resolve with missing modules: err = %v, want one naming btrfs and xfs", err)
	}
}

func TestResolveCycleAndDanglingDep(t *testing.T) {
	ix := &ModuleIndex{Dir: "d", Deps: map[string][]string{"a.ko": {"b.ko"}, "b.ko": {"a.ko"}, "c.ko": {"gone.ko"}},
		byName: map[string]string{"a": "a.ko", "b": "b.ko", "c": "c.ko"}, Builtin: map[string]bool{}, Aliases: map[string][]string{}}
	if _, err := ix.Resolve([]GuestModule{{Name: "a"}}); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Errorf("cycle: err = %v", err)
	}
	if _, err := ix.Resolve([]GuestModule{{Name: "c"}}); err == nil || !strings.Contains(err.Error(), "gone.ko") {
		t.Errorf("dangling dependency: err = %v", err)
	}
}

func TestLoadModuleIndexNeedsDepmod(t *testing.T) {
	dir := fakeModules(t, t.TempDir(), "r")
	os.Remove(filepath.Join(dir, "modules.dep"))
	if _, err := LoadModuleIndex(dir); err == nil || !strings.Contains(err.Error(), "depmod") {
		t.Errorf("index without modules.dep: err = %v, want a hint to run depmod", err)
	}
}

func TestPackListCompression(t *testing.T) {
	set := &ModuleSet{
		Index: &ModuleIndex{Dir: "/m"},
		Plan:  &ModulePlan{Load: []string{"kernel/a.ko", "kernel/b-c.ko.xz", "kernel/d.ko.zst"}},
	}
	set.InKernel = KernelDecompresses("#\nCONFIG_MODULE_DECOMPRESS=y\nCONFIG_MODULE_COMPRESS_XZ=y\n")
	got := set.PackList()
	want := []ModuleFile{
		{Name: "a", Source: "/m/kernel/a.ko", Guest: "000-a.ko"},
		{Name: "b_c", Source: "/m/kernel/b-c.ko.xz", Guest: "001-b_c.ko.xz"},
		{Name: "d", Source: "/m/kernel/d.ko.zst", Guest: "002-d.ko", Unpack: "zst"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("PackList =\n%v\nwant\n%v", got, want)
	}
	if s := LoadOrderFile(got); s != "a\t000-a.ko\nb_c\t001-b_c.ko.xz\nd\t002-d.ko\n" {
		t.Errorf("LoadOrderFile = %q", s)
	}
	// Without MODULE_DECOMPRESS the host unpacks everything.
	set.InKernel = KernelDecompresses("\nCONFIG_MODULE_COMPRESS_XZ=y\n# CONFIG_MODULE_DECOMPRESS is not set\n")
	for _, f := range set.PackList()[1:] {
		if f.Unpack == "" || strings.Count(f.Guest, ".") != 1 {
			t.Errorf("%s packed compressed for a kernel without MODULE_DECOMPRESS", f.Guest)
		}
	}
}

// bzImageHeader is the start of an x86 bzImage whose version string says rel.
func bzImageHeader(rel string) []byte {
	img := make([]byte, 0x1000)
	copy(img[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(img[0x20e:], 0x400)
	copy(img[0x600:], rel+" (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC Debian\x00")
	return img
}

func TestKernelRelease(t *testing.T) {
	if rel, err := KernelRelease(bzImageHeader("6.12.118+deb12-amd64")); err != nil || rel != "6.12.118+deb12-amd64" {
		t.Errorf("KernelRelease = %q, %v", rel, err)
	}
	if _, err := KernelRelease(make([]byte, 0x1000)); err == nil {
		t.Error("KernelRelease accepted an image without a setup header")
	}
	short := bzImageHeader("x")
	binary.LittleEndian.PutUint16(short[0x20e:], 0xf000)
	if _, err := KernelRelease(short); err == nil {
		t.Error("KernelRelease accepted a version offset past the end")
	}
}

func TestPrepareModulesAndPack(t *testing.T) {
	root := t.TempDir()
	rel := "6.1.0-57-amd64"
	fakeModules(t, root, rel)
	kernel := filepath.Join(root, "boot", "vmlinuz-"+rel)
	if err := os.MkdirAll(filepath.Dir(kernel), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kernel, bzImageHeader(rel), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The package root, /lib/modules and the release directory all work.
	for _, arg := range []string{root, filepath.Join(root, "lib", "modules"), filepath.Join(root, "lib", "modules", rel)} {
		if _, err := PrepareModules(ctx, kernel, arg, t.TempDir()); err == nil || !strings.Contains(err.Error(), "xfs") {
			// The fake tree lacks most of GuestModules: the error
			// must name them, which shows the tree was found.
			t.Errorf("PrepareModules(%s): err = %v, want one naming the missing modules", arg, err)
		}
	}
	if _, err := PrepareModules(ctx, kernel, filepath.Join(root, "lib"), t.TempDir()); err == nil || !strings.Contains(err.Error(), "no modules for kernel release") {
		t.Errorf("PrepareModules without a matching release: err = %v", err)
	}
	if k, m, err := FindPackageKernel(root); err != nil || k != kernel || m != filepath.Join(root, "lib", "modules", rel) {
		t.Errorf("FindPackageKernel = %s, %s, %v", k, m, err)
	}

	ix, err := LoadModuleIndex(filepath.Join(root, "lib", "modules", rel))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := ix.Resolve([]GuestModule{{Name: "virtio_console"}, {Name: "overlay"}})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := writeModulesCPIO(ctx, &buf, &ModuleSet{Release: rel, Index: ix, Plan: plan}); err != nil {
		t.Fatal(err)
	}
	rr := cpio.Newc.Reader(bytes.NewReader(buf.Bytes()))
	got := map[string]string{}
	for {
		rec, err := rr.ReadRecord()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Mode&0o170000 == 0o100000 {
			b, _ := io.ReadAll(rec.ReaderAt.(io.Reader))
			got[rec.Name] = string(b)
		}
	}
	want := map[string]string{
		"ovlkit/modules/000-virtio_ring.ko":    "ring",
		"ovlkit/modules/001-virtio.ko":         "virtio",
		"ovlkit/modules/002-virtio_console.ko": "console",
		"ovlkit/modules/003-overlay.ko":        "overlay",
		"ovlkit/modules/order":                 "virtio_ring\t000-virtio_ring.ko\nvirtio\t001-virtio.ko\nvirtio_console\t002-virtio_console.ko\noverlay\t003-overlay.ko\n",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("modules archive =\n%q\nwant\n%q", got, want)
	}
}
