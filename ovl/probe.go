package ovl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Features is what the running kernel and the backing filesystem support,
// each found by trying it in a scratch directory on that filesystem.
type Features struct {
	DType       bool `json:"d_type"`        // readdir reports file types
	Whiteouts   bool `json:"whiteouts"`     // the backing filesystem makes 0/0 character devices
	Xattrs      bool `json:"trusted_xattr"` // the backing filesystem stores trusted.* xattrs
	Overlay     bool `json:"overlay"`       // an overlay with an upper mounts here
	MultiLower  bool `json:"multi_lower"`   // more than one lower layer
	RedirectDir bool `json:"redirect_dir"`  // renaming a lower directory leaves a redirect (on by default)
	Metacopy    bool `json:"metacopy"`      // chmod of a lower file copies up metadata only (on by default)
	IndexParam  bool `json:"index_param"`   // the module has an index parameter: mounts say index=off
	Userxattr   bool `json:"userxattr"`     // the userxattr option is accepted
	NewMountAPI bool `json:"new_mount_api"` // fsconfig accepts lowerdir+
	StrictUpper bool `json:"strict_upper"`  // ovlkit series: fail instead of degrading
	FsyncStrict bool `json:"fsync_strict"`  // fsync=strict copy-up durability
	CopyUpStats bool `json:"copyup_stats"`  // ovlkit series: copy-up counters in sysfs
	// Notes says why a feature is off, keyed by its JSON name.
	Notes map[string]string `json:"notes,omitempty"`
}

// Missing lists the features that are off, with the reason when known.
func (f Features) Missing() []string {
	var out []string
	add := func(ok bool, name string) {
		if ok {
			return
		}
		if why := f.Notes[name]; why != "" {
			out = append(out, name+" ("+why+")")
		} else {
			out = append(out, name)
		}
	}
	add(f.DType, "d_type")
	add(f.Whiteouts, "whiteouts")
	add(f.Xattrs, "trusted_xattr")
	add(f.Overlay, "overlay")
	add(f.MultiLower, "multi_lower")
	add(f.NewMountAPI, "new_mount_api")
	add(f.StrictUpper, "strict_upper")
	add(f.FsyncStrict, "fsync_strict")
	add(f.CopyUpStats, "copyup_stats")
	return out
}

// Usable reports why the backing filesystem cannot hold overlay layers,
// or nil when it can.
func (f Features) Usable() error {
	if !f.DType {
		return errors.New("the backing filesystem does not report file types in readdir (d_type); " +
			"reformat xfs with -n ftype=1 or enable the ext4 filetype feature")
	}
	if !f.Whiteouts {
		return fmt.Errorf("the backing filesystem cannot hold overlay whiteouts (0/0 character devices): %s", f.Notes["whiteouts"])
	}
	if !f.Overlay {
		return fmt.Errorf("overlay cannot mount on the backing filesystem: %s", f.Notes["overlay"])
	}
	if !f.MultiLower {
		return fmt.Errorf("overlay does not take several lower layers: %s", f.Notes["multi_lower"])
	}
	return nil
}

// BaseOptions are the options every mount of a store gets on this kernel:
// index=off where the module has an index (a shared upper would otherwise
// fail with EBUSY when a mount leaks, containerd #4311), and strict_upper
// where the ovlkit series provides it so that a degraded upper is an error.
// strict_upper does not touch the in-use check: with index=off an upper or
// work dir still used by a leaked mount is a kernel warning, not EBUSY,
// with or without it.
func (f Features) BaseOptions() []string {
	var o []string
	if f.IndexParam {
		o = append(o, "index=off")
	}
	if f.StrictUpper {
		o = append(o, "strict_upper")
	}
	return o
}

// Probe tries every feature in a temporary directory beneath dir, which
// must be on the filesystem that will hold the layers. It needs root
// (mount). The error is only for failures of the probe itself; a missing
// feature is reported in Features.
func Probe(dir string) (Features, error) {
	f := Features{Notes: map[string]string{}}
	base, err := os.MkdirTemp(dir, "probe-")
	if err != nil {
		return f, fmt.Errorf("probe directory: %w", err)
	}
	defer os.RemoveAll(base)
	p := &prober{base: base, f: &f}
	// Each step probes one feature or a group found by one mount; a step
	// returns false when the ones after it cannot work.
	steps := []func() (bool, error){
		p.dType, p.backingFS, p.overlay, p.multiLower, p.options, p.newMountAPI,
	}
	for _, step := range steps {
		more, err := step()
		if err != nil || !more {
			return f, err
		}
	}
	return f, nil
}

// prober holds what the probe steps share: the scratch directory, the
// result, and the options every probe mount gets.
type prober struct {
	base string
	f    *Features
	opts []string
}

func (p *prober) dType() (bool, error) {
	var err error
	if p.f.DType, err = SupportsDType(p.base); err != nil {
		return false, err
	}
	if !p.f.DType {
		p.f.Notes["d_type"] = "readdir returns DT_UNKNOWN"
	}
	return true, nil
}

// backingFS probes whiteouts and trusted xattrs, which live on the
// backing filesystem: a filesystem without them (FAT) still takes an
// overlay mount on 6.1, with a warning, and fails only at the first
// deletion. It also finds the index parameter, which sets the options of
// every later probe mount.
func (p *prober) backingFS() (bool, error) {
	if err := unix.Mknod(filepath.Join(p.base, "whiteout"), unix.S_IFCHR|0o600, 0); err != nil {
		p.f.Notes["whiteouts"] = "mknod: " + err.Error()
	} else {
		p.f.Whiteouts = true
	}
	if err := unix.Setxattr(p.base, "trusted.ovlkit.probe", []byte("y"), 0); err != nil {
		p.f.Notes["trusted_xattr"] = "setxattr: " + err.Error()
	} else {
		p.f.Xattrs = true
	}
	if _, err := os.Stat("/sys/module/overlay/parameters/index"); err == nil {
		p.f.IndexParam = true
		p.opts = append(p.opts, "index=off")
	}
	return true, nil
}

// overlay mounts one upper on one lower.
func (p *prober) overlay() (bool, error) {
	d, err := newProbeDirs(p.base, "single", 1)
	if err != nil {
		return false, err
	}
	if err := d.try(p.opts); err != nil {
		p.f.Notes["overlay"] = err.Error()
		p.f.Notes["multi_lower"] = "no overlay"
		return false, nil
	}
	p.f.Overlay = true
	return true, d.unmount()
}

// multiLower mounts two lowers, then learns from that mount how a default
// mount behaves (metacopy, redirect_dir) and whether it has copy-up
// counters.
func (p *prober) multiLower() (bool, error) {
	d, err := newProbeDirs(p.base, "multi", 2)
	if err != nil {
		return false, err
	}
	if err := os.WriteFile(filepath.Join(d.lower[1], "file"), []byte("data"), 0o644); err != nil {
		return false, fmt.Errorf("probe file: %w", err)
	}
	if err := os.Mkdir(filepath.Join(d.lower[1], "dir1"), 0o755); err != nil {
		return false, fmt.Errorf("probe dir: %w", err)
	}
	if err := d.try(p.opts); err != nil {
		p.f.Notes["multi_lower"] = err.Error()
		return false, nil
	}
	p.f.MultiLower = true
	if p.f.Metacopy, err = probeMetacopy(d); err != nil {
		d.unmount()
		return false, err
	}
	if p.f.RedirectDir, err = probeRedirect(d); err != nil {
		d.unmount()
		return false, err
	}
	p.copyUpStats(d.merged)
	return true, d.unmount()
}

// copyUpStats reads the counters of the probe mount, not only looks for
// them, so that a store never claims statistics its Status could not
// show.
func (p *prober) copyUpStats(merged string) {
	switch _, err := CopyUpStats(merged); {
	case err == nil:
		p.f.CopyUpStats = true
	case errors.Is(err, os.ErrNotExist):
		p.f.Notes["copyup_stats"] = "the overlay has no counter directory in " + sysfsOverlay
	default:
		p.f.Notes["copyup_stats"] = err.Error()
	}
}

// options mounts once with each mount option that a kernel may lack.
func (p *prober) options() (bool, error) {
	for _, o := range []struct {
		name string
		opt  string
		dst  *bool
	}{
		{"userxattr", "userxattr", &p.f.Userxattr},
		{"strict_upper", "strict_upper", &p.f.StrictUpper},
		{"fsync_strict", "fsync=strict", &p.f.FsyncStrict},
	} {
		d, err := newProbeDirs(p.base, o.name, 2)
		if err != nil {
			return false, err
		}
		if err := d.try(append(append([]string{}, p.opts...), o.opt)); err != nil {
			p.f.Notes[o.name] = err.Error()
			continue
		}
		*o.dst = true
		if err := d.unmount(); err != nil {
			return false, err
		}
	}
	return true, nil
}

// newMountAPI builds an overlay with fsconfig lowerdir+.
func (p *prober) newMountAPI() (bool, error) {
	d, err := newProbeDirs(p.base, "fsconfig", 2)
	if err != nil {
		return false, err
	}
	if err := probeLowerdirPlus(d, p.opts); err != nil {
		p.f.Notes["new_mount_api"] = err.Error()
	} else {
		p.f.NewMountAPI = true
	}
	return true, nil
}

type probeDirs struct {
	lower        []string
	upper, work  string
	merged       string
	mountedState bool
}

func newProbeDirs(base, name string, nLower int) (*probeDirs, error) {
	d := filepath.Join(base, name)
	p := &probeDirs{upper: filepath.Join(d, "upper"), work: filepath.Join(d, "work"), merged: filepath.Join(d, "merged")}
	for i := 0; i < nLower; i++ {
		p.lower = append(p.lower, filepath.Join(d, fmt.Sprintf("lower%d", i)))
	}
	for _, x := range append([]string{p.upper, p.work, p.merged}, p.lower...) {
		if err := os.MkdirAll(x, 0o755); err != nil {
			return nil, fmt.Errorf("probe directory: %w", err)
		}
	}
	return p, nil
}

func (p *probeDirs) config(opts []string) Config {
	return Config{Lower: p.lower, Upper: p.upper, Work: p.work, Options: opts}
}

func (p *probeDirs) try(opts []string) error {
	if err := (Mounter{}).Mount(p.merged, p.config(opts), false); err != nil {
		return err
	}
	p.mountedState = true
	return nil
}

func (p *probeDirs) unmount() error {
	if !p.mountedState {
		return nil
	}
	p.mountedState = false
	return Unmount(p.merged, true)
}

func probeMetacopy(p *probeDirs) (bool, error) {
	if err := os.Chmod(filepath.Join(p.merged, "file"), 0o600); err != nil {
		return false, fmt.Errorf("metacopy probe chmod: %w", err)
	}
	_, err := unix.Lgetxattr(filepath.Join(p.upper, "file"), Trusted.Name(XattrMetacopy), nil)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENODATA):
		return false, nil
	default:
		return false, fmt.Errorf("metacopy probe getxattr: %w", err)
	}
}

func probeRedirect(p *probeDirs) (bool, error) {
	err := os.Rename(filepath.Join(p.merged, "dir1"), filepath.Join(p.merged, "dir2"))
	if errors.Is(err, unix.EXDEV) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("redirect_dir probe rename: %w", err)
	}
	_, err = unix.Lgetxattr(filepath.Join(p.upper, "dir2"), Trusted.Name(XattrRedirect), nil)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, unix.ENODATA) {
		return false, nil
	}
	return false, fmt.Errorf("redirect_dir probe getxattr: %w", err)
}

// probeLowerdirPlus builds (but does not attach) an overlay with fsconfig
// lowerdir+. Kernels before 6.8 either lack fsopen for overlay or pass the
// unknown key to the legacy parser, which refuses it at create time.
func probeLowerdirPlus(p *probeDirs, opts []string) error {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen: %w", err)
	}
	defer unix.Close(fd)
	for _, l := range p.lower {
		if err := unix.FsconfigSetString(fd, "lowerdir+", l); err != nil {
			return fmt.Errorf("fsconfig lowerdir+: %w", err)
		}
	}
	if err := unix.FsconfigSetString(fd, "upperdir", p.upper); err != nil {
		return fmt.Errorf("fsconfig upperdir: %w", err)
	}
	if err := unix.FsconfigSetString(fd, "workdir", p.work); err != nil {
		return fmt.Errorf("fsconfig workdir: %w", err)
	}
	for _, o := range opts {
		k, v, _ := strings.Cut(o, "=")
		if err := unix.FsconfigSetString(fd, k, v); err != nil {
			return fmt.Errorf("fsconfig %s: %w", o, err)
		}
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return fmt.Errorf("fsconfig create: %w", err)
	}
	return nil
}

// SupportsDType reports whether readdir on dir's filesystem fills in
// d_type. Go's os.ReadDir hides DT_UNKNOWN by falling back to lstat, so
// the raw getdents64 records are read here.
func SupportsDType(dir string) (bool, error) {
	d, err := os.MkdirTemp(dir, "dtype-")
	if err != nil {
		return false, fmt.Errorf("d_type probe: %w", err)
	}
	defer os.RemoveAll(d)
	if err := os.WriteFile(filepath.Join(d, "f"), nil, 0o644); err != nil {
		return false, fmt.Errorf("d_type probe: %w", err)
	}
	fd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("d_type probe: %w", err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 4096)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return false, fmt.Errorf("d_type probe getdents: %w", err)
		}
		if n == 0 {
			return false, errors.New("d_type probe: file not listed")
		}
		if typ, ok := direntType(buf[:n], "f"); ok {
			return typ != unix.DT_UNKNOWN, nil
		}
	}
}

// direntType finds name in linux_dirent64 records (ino u64, off s64,
// reclen u16, type u8, name NUL-terminated).
func direntType(buf []byte, name string) (uint8, bool) {
	for len(buf) >= 19 {
		reclen := int(binary.NativeEndian.Uint16(buf[16:18]))
		if reclen < 19 || reclen > len(buf) {
			return 0, false
		}
		typ := buf[18]
		nm := buf[19:reclen]
		if i := indexByte(nm, 0); i >= 0 {
			nm = nm[:i]
		}
		if string(nm) == name {
			return typ, true
		}
		buf = buf[reclen:]
	}
	return 0, false
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}
