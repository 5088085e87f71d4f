// Package ovl is the kernel interface of ovlkit: it builds overlay mount
// options, mounts with the legacy mount(2) data or with the new mount API
// (fsopen/fsconfig) where the kernel has it, probes what the running kernel
// and backing filesystem support, names the overlay xattrs and reads the
// copy-up statistics the ovlkit series reports in sysfs.
//
// Every feature is detected by trying it, never by comparing kernel
// versions: distributions backport options, and the ovlkit series adds
// options that no upstream version number describes.
package ovl

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// MaxLowers is the kernel's OVL_MAX_STACK: an overlay mount takes at most
// this many lower layers, whatever the mount API.
const MaxLowers = 500

// ErrTooManyLowers is returned for a configuration with more than MaxLowers
// lower layers, before the kernel would answer EINVAL.
var ErrTooManyLowers = errors.New("overlayfs stacks at most 500 lower layers")

// ErrDataTooLong is returned when the legacy mount data does not fit in the
// page the kernel copies it into, even with paths relative to Config.Base.
var ErrDataTooLong = errors.New("overlay mount data does not fit in one page")

// Config describes one overlay mount.
type Config struct {
	// Lower holds the lower layers, topmost first, as in lowerdir=.
	Lower []string
	// Upper and Work are both set for a writable mount, both empty for a
	// read-only one.
	Upper, Work string
	// Options are extra mount options ("index=off", "strict_upper",
	// "fsync=strict", ...), in order.
	Options []string
	// NoSuid and NoDev add the mount flags MS_NOSUID and MS_NODEV
	// (MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV with fsmount): through the
	// mount, exec ignores setuid and setgid bits and file capabilities,
	// and device nodes cannot be opened. They are flags of the mount,
	// not overlay options, so they never count against the page of
	// legacy mount data.
	NoSuid, NoDev bool
	// Base, when set, is the directory the paths are made relative to
	// when the absolute form of the legacy mount data is longer than a
	// page. The mount then happens from a thread whose working directory
	// is Base (the technique of moby's overlay2 and containerd).
	Base string
}

// Validate reports configuration errors the kernel would otherwise answer
// with a bare EINVAL.
func (c Config) Validate() error {
	if len(c.Lower) == 0 {
		return errors.New("overlay needs at least one lower layer")
	}
	if len(c.Lower) > MaxLowers {
		return fmt.Errorf("%d lower layers: %w", len(c.Lower), ErrTooManyLowers)
	}
	if (c.Upper == "") != (c.Work == "") {
		return errors.New("overlay upper and work directories must be given together")
	}
	if c.Upper == "" && len(c.Lower) < 2 {
		// The kernel refuses a read-only overlay of a single lower.
		return errors.New("a read-only overlay needs at least two lower layers")
	}
	for _, o := range c.Options {
		if o == "" || strings.ContainsRune(o, ',') {
			return fmt.Errorf("invalid overlay option %q", o)
		}
	}
	return nil
}

// escapePath protects the characters the legacy option parser splits on:
// ',' between options, ':' between lower layers, and the escape itself.
func escapePath(p string) string {
	if !strings.ContainsAny(p, `,:\`) {
		return p
	}
	var b strings.Builder
	for _, r := range p {
		if r == ',' || r == ':' || r == '\\' {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// dataLen is len(c.Data()) without building the string: a 500-layer
// configuration under a long home is checked on every Create, and its
// absolute form (well over a page) is never used.
func (c Config) dataLen() int {
	esc := func(p string) int {
		n := len(p)
		for i := 0; i < len(p); i++ {
			if p[i] == ',' || p[i] == ':' || p[i] == '\\' {
				n++
			}
		}
		return n
	}
	n := len("lowerdir=")
	for i, l := range c.Lower {
		if i > 0 {
			n++
		}
		n += esc(l)
	}
	if c.Upper != "" {
		n += len(",upperdir=") + esc(c.Upper) + len(",workdir=") + esc(c.Work)
	}
	for _, o := range c.Options {
		n += 1 + len(o)
	}
	return n
}

// Data renders the legacy mount(2) data string.
func (c Config) Data() string {
	var b strings.Builder
	b.WriteString("lowerdir=")
	for i, l := range c.Lower {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(escapePath(l))
	}
	if c.Upper != "" {
		b.WriteString(",upperdir=")
		b.WriteString(escapePath(c.Upper))
		b.WriteString(",workdir=")
		b.WriteString(escapePath(c.Work))
	}
	for _, o := range c.Options {
		b.WriteByte(',')
		b.WriteString(o)
	}
	return b.String()
}

// OptionList renders c as the option list of a mount(8)-style caller,
// one option per element: lowerdir= (the layers joined with ':'),
// upperdir= and workdir= for a writable mount, c.Options in order, then
// "ro" for readOnly and "nosuid" and "nodev" as c asks. Paths stay
// absolute and escaped as in Data; a caller that hits the page limit
// shortens them itself (containerd makes the lowers relative to their
// common directory).
func (c Config) OptionList(readOnly bool) []string {
	low := make([]string, len(c.Lower))
	for i, l := range c.Lower {
		low[i] = escapePath(l)
	}
	out := []string{"lowerdir=" + strings.Join(low, ":")}
	if c.Upper != "" {
		out = append(out, "upperdir="+escapePath(c.Upper), "workdir="+escapePath(c.Work))
	}
	out = append(out, c.Options...)
	for _, f := range []struct {
		on   bool
		name string
	}{{readOnly, "ro"}, {c.NoSuid, "nosuid"}, {c.NoDev, "nodev"}} {
		if f.on {
			out = append(out, f.name)
		}
	}
	return out
}

// Relative returns c with every layer path made relative to base.
func (c Config) Relative(base string) (Config, error) {
	prefix := strings.TrimSuffix(base, "/") + "/"
	rel := func(p string) (string, error) {
		if p == "" {
			return "", nil
		}
		// Fast path for paths below base, the common case: a store's
		// 500 lowers all live in one directory.
		if r, ok := strings.CutPrefix(p, prefix); ok && r != "" && !strings.Contains(r, "..") && filepath.Clean(r) == r {
			return r, nil
		}
		r, err := filepath.Rel(base, p)
		if err != nil {
			return "", fmt.Errorf("path %s relative to %s: %w", p, base, err)
		}
		return r, nil
	}
	out := c
	out.Lower = make([]string, len(c.Lower))
	for i, l := range c.Lower {
		r, err := rel(l)
		if err != nil {
			return Config{}, err
		}
		out.Lower[i] = r
	}
	var err error
	if out.Upper, err = rel(c.Upper); err != nil {
		return Config{}, err
	}
	if out.Work, err = rel(c.Work); err != nil {
		return Config{}, err
	}
	out.Base = ""
	return out, nil
}

// FitsPage reports whether legacy mount data of n bytes fits in a page of
// pageSize bytes. The kernel copies at most one page and needs the
// terminating NUL inside it, so a string of exactly pageSize bytes fails
// (containers/storage #1159).
func FitsPage(n, pageSize int) bool { return n <= pageSize-1 }

// Plan is how a legacy mount will be done: the data and, when it had to be
// made relative, the directory to mount from.
type Plan struct {
	Data string
	Dir  string // empty: absolute paths
}

// LegacyPlan chooses between absolute and Base-relative mount data and
// fails with ErrDataTooLong when neither fits a page.
func (c Config) LegacyPlan(pageSize int) (Plan, error) {
	if err := c.Validate(); err != nil {
		return Plan{}, err
	}
	absLen := c.dataLen()
	if FitsPage(absLen, pageSize) {
		return Plan{Data: c.Data()}, nil
	}
	if c.Base == "" {
		return Plan{}, fmt.Errorf("%d bytes with %d lower layers, page %d: %w", absLen, len(c.Lower), pageSize, ErrDataTooLong)
	}
	r, err := c.Relative(c.Base)
	if err != nil {
		return Plan{}, err
	}
	rel := r.Data()
	if !FitsPage(len(rel), pageSize) {
		return Plan{}, fmt.Errorf("%d bytes relative to %s with %d lower layers, page %d: %w", len(rel), c.Base, len(c.Lower), pageSize, ErrDataTooLong)
	}
	return Plan{Data: rel, Dir: c.Base}, nil
}
