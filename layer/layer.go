// Package layer converts between OCI/Docker tar layers and overlayfs diff
// directories.
//
// A tar layer describes deletions with ".wh." entries; an overlay upper
// directory describes them with whiteout devices and opaque xattrs. Apply
// turns the first into the second beneath a root that hostile entries cannot
// leave; Export and ExportChanges turn a diff back into a tar; Changes lists
// what a diff changes relative to its lower layers without walking the
// lowers; TreeChanges is the plain two-tree comparison that Changes is tested
// against.
package layer

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/ovlkit/ovlkit/ovl"
)

// WhiteoutFormat is how whiteouts and opaque directories are stored on disk.
type WhiteoutFormat int

const (
	// OverlayWhiteouts stores a whiteout as a 0/0 character device and an
	// opaque directory as trusted.overlay.opaque=y, as a privileged overlay
	// mount expects.
	OverlayWhiteouts WhiteoutFormat = iota
	// OverlayUserWhiteouts is the form an overlay mounted with userxattr
	// reads: opaque directories carry user.overlay.opaque=y. Apply still
	// writes whiteouts as 0/0 character devices, which every kernel with
	// userxattr (5.11+) accepts even inside a user namespace; Export and
	// Changes also recognise the xattr whiteout (an empty regular file with
	// user.overlay.whiteout) that newer kernels accept.
	OverlayUserWhiteouts
)

// String names the format for messages.
func (f WhiteoutFormat) String() string {
	switch f {
	case OverlayWhiteouts:
		return "overlay"
	case OverlayUserWhiteouts:
		return "overlay-userxattr"
	}
	return fmt.Sprintf("WhiteoutFormat(%d)", int(f))
}

// xattrPrefix is the namespace overlayfs reads its own xattrs from in this
// format.
func (f WhiteoutFormat) xattrPrefix() (string, error) {
	switch f {
	case OverlayWhiteouts:
		return string(ovl.Trusted), nil
	case OverlayUserWhiteouts:
		return string(ovl.User), nil
	}
	return "", fmt.Errorf("layer: unknown whiteout format %d", int(f))
}

// ApplyOptions tunes Apply.
type ApplyOptions struct {
	Whiteouts WhiteoutFormat
	// Sync fsyncs every file and directory written before Apply returns,
	// so that a layer made visible afterwards by a rename survives a crash.
	Sync bool
	// Lowers are the parent layer directories, top first. When an entry's
	// parent directory is missing from the tar, Apply creates it with the
	// mode, owner and xattrs the lowers show for it, so that the new upper
	// directory does not hide the lower's permissions behind 0755 root.
	// Without lowers such directories are created 0755 and owned by 0:0.
	Lowers []string
	// Limits bound what the layer may cost; the zero value is
	// DefaultLimits.
	Limits Limits
	// MaxSize, when positive, replaces Limits.MaxSize; it is the field
	// this limit had before Limits gathered them.
	MaxSize int64
	// Digest, when set, is called with the digest of every regular file
	// Apply writes, once its data and metadata are in: the SHA-256 of its
	// content (DigestSparseSHA256 for a sparse entry), computed from the
	// bytes as they stream from the tar to the file, so that recording
	// what a layer holds costs no second read. A file a later entry
	// replaces was reported too; the caller keeps what the finished tree
	// still holds, by Dev and Ino.
	Digest func(FileDigest)
}

// Limits bound what one layer may cost the store, whatever its tar says.
// A zero field takes its default (the Default* constants); a negative one
// turns that limit off. A layer that reaches a limit is refused with an
// error that wraps the limit's sentinel (ErrTooLarge, ErrTooManyEntries,
// ErrTooDeep, ErrDecoderWindow) and names the limit and its value.
type Limits struct {
	// MaxSize bounds the declared sizes of the regular file entries,
	// added up as they are read: a sparse entry counts its full length,
	// an entry a later one replaces counts too. It is checked before an
	// entry's data is read.
	MaxSize int64
	// MaxEntries bounds the number of tar entries (headers of files,
	// directories, links, devices and whiteouts).
	MaxEntries int64
	// MaxDepth bounds the number of components of an entry's path, and
	// the directory depth of the finished tree, which symlinks in entry
	// paths could otherwise take further than any name.
	MaxDepth int
	// MaxDecoderWindow bounds the window a zstd frame may ask for: the
	// decoder allocates the window before it decodes a byte, so a frame
	// header alone could otherwise claim hundreds of megabytes. Turned
	// off, the decoder's own maximum applies. The decoder may keep up to
	// twice the window (see roomyHistory).
	MaxDecoderWindow int64
}

// The default limits: far above what real images need (the largest
// public images are tens of gigabytes and a few hundred thousand entries;
// zstd's --long and --ultra levels use windows of at most 128 MiB), far
// below what a hostile layer could otherwise make a store pay.
const (
	DefaultMaxSize          = 64 << 30 // 64 GiB
	DefaultMaxEntries       = 4_000_000
	DefaultMaxDepth         = 256
	DefaultMaxDecoderWindow = 128 << 20 // 128 MiB
)

// DefaultLimits returns the limits a zero Limits stands for.
func DefaultLimits() Limits {
	return Limits{
		MaxSize:          DefaultMaxSize,
		MaxEntries:       DefaultMaxEntries,
		MaxDepth:         DefaultMaxDepth,
		MaxDecoderWindow: DefaultMaxDecoderWindow,
	}
}

// effective fills zero fields with their defaults and turns negative ones
// into 0, which the checks read as "no limit".
func (l Limits) effective() Limits {
	d := DefaultLimits()
	pick := func(v, def int64) int64 {
		switch {
		case v == 0:
			return def
		case v < 0:
			return 0
		}
		return v
	}
	return Limits{
		MaxSize:          pick(l.MaxSize, d.MaxSize),
		MaxEntries:       pick(l.MaxEntries, d.MaxEntries),
		MaxDepth:         int(pick(int64(l.MaxDepth), int64(d.MaxDepth))),
		MaxDecoderWindow: pick(l.MaxDecoderWindow, d.MaxDecoderWindow),
	}
}

// ExportOptions tunes Export and Changes.
type ExportOptions struct {
	Whiteouts WhiteoutFormat
	// Lowers are the parent layer directories, top first. They are used to
	// drop opaque markers that hide nothing, and to follow redirect_dir
	// directories and metacopy files into the layers that hold their
	// content. Nil means the lowers are unknown: every opaque marker is
	// kept, and a diff that needs its lowers is refused.
	Lowers []string
}

// ChangeKind says how a path changed.
type ChangeKind int

const (
	ChangeAdd ChangeKind = iota
	ChangeModify
	ChangeDelete
)

// String returns the one-letter form used by docker diff (A, C, D).
func (k ChangeKind) String() string {
	switch k {
	case ChangeAdd:
		return "A"
	case ChangeModify:
		return "C"
	case ChangeDelete:
		return "D"
	}
	return fmt.Sprintf("ChangeKind(%d)", int(k))
}

// Change is one changed path. Path is absolute within the layer ("/a/b").
type Change struct {
	Path string
	Kind ChangeKind
}

// String formats the change as docker diff does ("C /etc").
func (c Change) String() string { return c.Kind.String() + " " + c.Path }

// Errors that EntryError wraps, for callers that want to tell a hostile
// layer from an I/O failure.
var (
	// ErrUnsafePath marks an entry name or link target that is absolute,
	// contains "..", or resolves outside the root.
	ErrUnsafePath = errors.New("path escapes the layer root")
	// ErrOverlayXattr marks an entry carrying a trusted.overlay.* or
	// user.overlay.* xattr: a layer could use one to plant a redirect or an
	// opaque marker that the overlay mount would obey.
	ErrOverlayXattr = errors.New("overlay xattrs are not allowed in a layer")
	// ErrInvalidWhiteout marks a .wh. entry that names nothing (".wh.",
	// ".wh..", ".wh..."), and a .wh. name where a layer can hold no
	// whiteout: a directory entry, or a directory on the way to an entry
	// (".wh.x/y", ".wh..wh..opq/z").
	ErrInvalidWhiteout = errors.New("invalid whiteout entry")
	// ErrTooLarge marks the entry that took a layer past Limits.MaxSize.
	ErrTooLarge = errors.New("layer exceeds the size limit MaxSize")
	// ErrTooManyEntries marks the entry that took a layer past
	// Limits.MaxEntries.
	ErrTooManyEntries = errors.New("layer exceeds the entry limit MaxEntries")
	// ErrTooDeep marks an entry, or a directory of the finished tree,
	// deeper than Limits.MaxDepth.
	ErrTooDeep = errors.New("layer exceeds the depth limit MaxDepth")
	// ErrDecoderWindow marks a zstd frame asking for a window larger than
	// Limits.MaxDecoderWindow.
	ErrDecoderWindow = errors.New("zstd window exceeds the limit MaxDecoderWindow")
	// ErrUnsupportedEntry marks an entry type a layer cannot hold.
	ErrUnsupportedEntry = errors.New("unsupported entry type")
)

// EntryError reports which tar entry Apply failed on.
type EntryError struct {
	Name string // the entry name as it appears in the tar
	Err  error
}

func (e *EntryError) Error() string { return fmt.Sprintf("layer entry %q: %v", e.Name, e.Err) }

func (e *EntryError) Unwrap() error { return e.Err }

// Apply reads a tar stream (plain, gzip or zstd, detected from the magic)
// and unpacks it beneath root, converting .wh. entries. Every path is
// resolved beneath root; hostile entries fail with an error naming the
// entry. It returns the content size of root afterwards, as Size reports
// it: the sizes of the regular files the layer leaves, hard links not
// counted again, entries that later ones replaced or whited out not at
// all.
//
// On error root may hold a partial tree: callers apply into a staging
// directory and discard it.
func Apply(ctx context.Context, root string, r io.Reader, opts ApplyOptions) (int64, error) {
	return apply(ctx, root, r, opts)
}

// Export writes the overlay diff directory diff as an OCI tar layer:
// whiteouts become .wh. entries and opaque directories .wh..wh..opq entries,
// overlay xattrs are left out. A diff entry whose name starts with .wh. is
// refused: in a tar it would read as a whiteout.
func Export(ctx context.Context, w io.Writer, diff string, opts ExportOptions) error {
	return export(ctx, w, diff, opts)
}

// Changes lists what diff changes relative to lowers (top first), sorted
// by path. It reads diff and looks up only the paths diff holds in the
// lowers, except below opaque or redirected directories, whose whole
// merged content it compares. The result equals TreeChanges on the
// flattened lowers and the flattened lowers plus diff. Only
// opts.Whiteouts is used: the lowers are the argument.
func Changes(ctx context.Context, diff string, lowers []string, opts ExportOptions) ([]Change, error) {
	return changes(ctx, diff, lowers, opts)
}

// TreeChanges is the naive reference: it compares two full trees (oldRoot
// may be "" for none) and returns the changes sorted by path. A directory
// whose children changed is reported as modified.
func TreeChanges(ctx context.Context, oldRoot, newRoot string) ([]Change, error) {
	return treeChanges(ctx, oldRoot, newRoot)
}

// ExportChanges writes a tar of newRoot restricted to changes; deletions
// become whiteouts.
func ExportChanges(ctx context.Context, w io.Writer, newRoot string, changes []Change) error {
	return exportChanges(ctx, w, newRoot, changes)
}

// Size is the content size of a diff directory: the bytes of its regular
// files, each hard-linked inode counted once.
func Size(diff string) (int64, error) {
	return size(diff)
}
