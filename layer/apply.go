package layer

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/ovlkit/ovlkit/ovl"
	"golang.org/x/sys/unix"
)

const (
	whiteoutPrefix = ".wh."
	// whiteoutMetaPrefix starts the names AUFS kept its own bookkeeping
	// under; such entries describe nothing in the layer.
	whiteoutMetaPrefix = whiteoutPrefix + whiteoutPrefix
	whiteoutOpaque     = whiteoutMetaPrefix + ".opq"

	// copyBufSize is large enough that a typical file is one read and
	// one write, small enough to keep per-Apply memory flat.
	copyBufSize = 1 << 20
	// holeBlock is the granularity at which runs of zeros are skipped
	// instead of written, leaving holes as sparse tar entries intend.
	holeBlock = 4096
	// maxCachedDirs bounds the open directory descriptors kept between
	// entries; tars list siblings together, so a few suffice.
	maxCachedDirs = 64
)

var zeroBlock [holeBlock]byte

// dirRef is an open directory beneath the root and its identity. What
// Apply remembers about a directory is keyed by the identity: a tar can
// reach one directory by several paths (through symlinks), and one path
// can name different directories over the course of a tar.
type dirRef struct {
	fd  int
	key inodeKey
}

// dirMeta is what a file created in a directory inherits from it.
type dirMeta struct {
	newGid int
	// defaultACL: files created here take their mode from a default ACL,
	// not from the mode given to open and the umask.
	defaultACL bool
}

func statKey(st *unix.Stat_t) inodeKey { return inodeKey{uint64(st.Dev), st.Ino} }

type dirTimes struct {
	atime, mtime unix.Timespec
}

// applier holds the state of one Apply call.
type applier struct {
	ctx    context.Context
	root   string
	rootFd int
	opts   ApplyOptions
	prefix string // overlay xattr prefix for opaque markers
	lowers *fsView

	// dirs caches descriptors of directories beneath root by their
	// cleaned relative path ("" is root). It is flushed whenever a
	// directory or symlink is removed, since a cached path could then name
	// a different directory than the descriptor.
	dirs map[string]dirRef
	// meta caches dirMeta by directory; an entry goes when its directory's
	// owner or mode changes, whatever path the change came through.
	meta map[inodeKey]dirMeta
	// links names the tar entry that made each symlink whose target
	// climbs with "..": the final check of such targets reports it.
	links map[inodeKey]string
	// retired holds descriptors dropped from dirs during the current
	// entry; callers may still hold them, so they close between entries.
	retired []int
	times   map[inodeKey]dirTimes // directory times to set once all entries are in
	dirty   map[inodeKey]bool     // directories to fsync when opts.Sync
	buf     []byte
	size    int64 // bytes of regular file entries so far, for MaxSize
	limits  Limits
	entries int64 // tar entries so far, for MaxEntries
	// stream is what archive/tar reads; sparse is the map of the
	// current entry when it is sparse and its data not yet consumed.
	stream *tarStream
	sparse *sparseEntry
	// inSparse: the current entry is sparse, consumed or not; archive/tar
	// must never be asked for its content, holes and all.
	inSparse bool
	// euid and egid own what Apply creates, unless a setgid directory
	// passes its group on; a file already owned as its entry says needs
	// no chown.
	euid, egid int
	rootKey    inodeKey
	// umask of the process, read once.
	umask uint32
	// sum and sparseSum hash the current regular entry's data as it
	// streams through copyRange when opts.Digest is set (sparseSum for a
	// sparse entry); hashing says which, if any, is fed.
	sum       hash.Hash
	sparseSum *SparseHash
	hashing   DigestAlgo
	// rootOpaque records a .wh..wh..opq at the top of the tar. overlayfs
	// ignores the opaque xattr on a layer's root, so with known lowers
	// it is turned into whiteouts of everything the lowers show there.
	rootOpaque bool
}

func apply(ctx context.Context, root string, r io.Reader, opts ApplyOptions) (int64, error) {
	a, err := newApplier(ctx, root, opts)
	if err != nil {
		return 0, err
	}
	defer a.close()
	plain, closeDecomp, err := decompress(r, a.limits.MaxDecoderWindow)
	if err != nil {
		return 0, fmt.Errorf("layer: %w", err)
	}
	defer closeDecomp()
	if err := a.readTar(plain); err != nil {
		return a.size, err
	}
	// Reading the compressed stream to its end checks its trailer (gzip
	// CRC, zstd checksum): a corrupted layer must not apply silently just
	// because the damage sits in the padding after the tar.
	if _, err := io.Copy(io.Discard, plain); err != nil {
		return a.size, fmt.Errorf("layer: read past end of tar: %w", err)
	}
	if err := a.finish(); err != nil {
		return a.size, err
	}
	// a.size counts every regular file entry as it is read, which is what
	// MaxSize limits; entries that later ones replaced or whited out are
	// not in the layer, and the size recorded for it must be what Size
	// reads back from it.
	n, err := size(root)
	if err != nil {
		return a.size, err
	}
	return n, nil
}

// newApplier opens root and readies an applier for it; the caller closes
// it.
func newApplier(ctx context.Context, root string, opts ApplyOptions) (*applier, error) {
	prefix, err := opts.Whiteouts.xattrPrefix()
	if err != nil {
		return nil, err
	}
	rootFd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("layer: open apply root %s: %w", root, err)
	}
	a := &applier{
		ctx:    ctx,
		root:   root,
		rootFd: rootFd,
		opts:   opts,
		prefix: prefix,
		dirs:   make(map[string]dirRef),
		meta:   make(map[inodeKey]dirMeta),
		links:  make(map[inodeKey]string),
		times:  make(map[inodeKey]dirTimes),
		dirty:  make(map[inodeKey]bool),
		buf:    make([]byte, copyBufSize),
		limits: opts.Limits.effective(),
	}
	if opts.MaxSize > 0 {
		a.limits.MaxSize = opts.MaxSize
	}
	if len(opts.Lowers) > 0 {
		a.lowers = &fsView{layers: opts.Lowers, prefix: prefix}
	}
	if opts.Digest != nil {
		a.sum, a.sparseSum = sha256.New(), NewSparseHash()
	}
	a.euid, a.egid = os.Geteuid(), os.Getegid()
	var rootSt unix.Stat_t
	if err := unix.Fstat(rootFd, &rootSt); err != nil {
		a.close()
		return nil, fmt.Errorf("layer: stat apply root %s: %w", root, err)
	}
	a.rootKey = statKey(&rootSt)
	a.umask = processUmask()
	return a, nil
}

// readTar applies every entry of the tar in plain, up to its end marker.
func (a *applier) readTar(plain io.Reader) error {
	tail := &trailerReader{r: plain}
	a.stream = &tarStream{r: tail}
	tr := tar.NewReader(a.stream)
	for {
		if err := a.ctx.Err(); err != nil {
			return fmt.Errorf("layer: apply: %w", err)
		}
		a.stream.record()
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if !tail.sawEndMarker() {
				return fmt.Errorf("layer: tar stream truncated after %d bytes: %w", tail.n, io.ErrUnexpectedEOF)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("layer: read tar after %d bytes: %w", tail.n, err)
		}
		a.sparse, err = a.stream.sparseMap(hdr)
		a.inSparse = a.sparse != nil
		if err == nil {
			err = a.countEntry()
		}
		if err == nil {
			err = a.entry(hdr, tr)
		}
		if err == nil {
			err = a.skipRest(tr)
		}
		a.closeRetired()
		if err != nil {
			return &EntryError{Name: hdr.Name, Err: err}
		}
	}
}

// countEntry counts the entry just read against MaxEntries.
func (a *applier) countEntry() error {
	a.entries++
	if m := a.limits.MaxEntries; m > 0 && a.entries > m {
		return fmt.Errorf("%w of %d entries", ErrTooManyEntries, m)
	}
	return nil
}

// skipRest reads what the entry's data the entry did not use, so that the
// next header's recording starts at its padding: a sparse entry's data
// from the stream itself (its holes cost nothing), any other through
// archive/tar.
func (a *applier) skipRest(tr *tar.Reader) error {
	if sp := a.sparse; sp != nil {
		a.sparse = nil
		if _, err := io.CopyN(io.Discard, a.stream.r, sp.physical); err != nil {
			return fmt.Errorf("skip sparse data: %w", noEOF(err))
		}
		a.stream.owed = sp.physical
		return nil
	}
	if a.inSparse {
		return nil
	}
	if _, err := io.Copy(io.Discard, tr); err != nil {
		return fmt.Errorf("skip data: %w", err)
	}
	return nil
}

func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

func (a *applier) close() {
	a.flushDirs()
	a.closeRetired()
	_ = unix.Close(a.rootFd)
}

// flushDirs forgets every cached directory descriptor, and the metadata
// cache with them, which keeps both bounded.
func (a *applier) flushDirs() {
	for k, d := range a.dirs {
		a.retired = append(a.retired, d.fd)
		delete(a.dirs, k)
	}
	clear(a.meta)
}

func (a *applier) closeRetired() {
	for _, fd := range a.retired {
		_ = unix.Close(fd)
	}
	a.retired = a.retired[:0]
}

// newGid is the group of a file created in the directory st describes.
func (a *applier) newGid(st *unix.Stat_t) int {
	if st.Mode&unix.S_ISGID != 0 {
		return int(st.Gid)
	}
	return a.egid
}

// dirMeta returns what a file created in d inherits from it.
func (a *applier) dirMeta(d dirRef) (dirMeta, error) {
	if m, ok := a.meta[d.key]; ok {
		return m, nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(d.fd, &st); err != nil {
		return dirMeta{}, fmt.Errorf("stat directory: %w", err)
	}
	m := dirMeta{newGid: a.newGid(&st), defaultACL: hasDefaultACL(d.fd)}
	a.meta[d.key] = m
	return m, nil
}

// changedDir records that base in pfd was just created, or had its owner
// or mode changed, and returns its identity: what was cached about the
// directory (or about an earlier one with the same inode number) is void.
func (a *applier) changedDir(pfd int, base string) (inodeKey, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return inodeKey{}, fmt.Errorf("stat directory %q: %w", base, err)
	}
	key := statKey(&st)
	delete(a.meta, key)
	delete(a.times, key)
	return key, nil
}

// cleanEntryName turns a tar entry name (or hard link target) into a
// relative path beneath the root, "" for the root itself. Absolute names
// and any ".." component are refused rather than rewritten: no well-formed
// layer has them, and guessing what a hostile one meant is how breakouts
// happen.
func cleanEntryName(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("empty name: %w", ErrUnsafePath)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("absolute name: %w", ErrUnsafePath)
	}
	if strings.IndexByte(name, 0) >= 0 {
		return "", fmt.Errorf("NUL in name: %w", ErrUnsafePath)
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", fmt.Errorf("\"..\" in name: %w", ErrUnsafePath)
		}
	}
	p := path.Clean(name)
	if p == "." {
		return "", nil
	}
	return p, nil
}

func splitRel(rel string) (dir, base string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return "", rel
	}
	return rel[:i], rel[i+1:]
}

// openDir returns a descriptor of the directory rel beneath root, creating
// missing directories on the way. Symlinks inside the tree are followed as
// the kernel would, but resolution never leaves root (RESOLVE_BENEATH) and
// never uses /proc magic links.
func (a *applier) openDir(rel string) (dirRef, error) {
	return a.openDirMode(rel, openCreate)
}

// openMode says what openDirMode does about a directory that is not there.
type openMode int

const (
	// openCreate creates missing directories, over whiteouts too.
	openCreate openMode = iota
	// openNoReplace creates missing directories but reports a whiteout
	// in the way as ENOTDIR.
	openNoReplace
)

// openDirMode is openDir with a choice of what to create.
func (a *applier) openDirMode(rel string, mode openMode) (dirRef, error) {
	if rel == "" {
		return dirRef{fd: a.rootFd, key: a.rootKey}, nil
	}
	if d, ok := a.dirs[rel]; ok {
		return d, nil
	}
	fd, err := unix.Openat2(a.rootFd, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOENT) || (mode == openCreate && errors.Is(err, unix.ENOTDIR)) {
		// Missing, or in the way (a whiteout): mkparent creates what the
		// tar left implicit and refuses anything else.
		if err := a.mkparent(rel); err != nil {
			return dirRef{}, err
		}
		fd, err = unix.Openat2(a.rootFd, rel, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
		})
	}
	if err != nil {
		if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ELOOP) {
			return dirRef{}, fmt.Errorf("directory %q resolves outside the root: %w", rel, ErrUnsafePath)
		}
		return dirRef{}, fmt.Errorf("open directory %q: %w", rel, err)
	}
	if len(a.dirs) >= maxCachedDirs {
		a.flushDirs()
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return dirRef{}, fmt.Errorf("stat directory %q: %w", rel, err)
	}
	d := dirRef{fd: fd, key: statKey(&st)}
	a.dirs[rel] = d
	return d, nil
}

// hasDefaultACL reports whether a directory has a default ACL, or might:
// only a clear "none" (no such xattr, or no ACL support) says no.
func hasDefaultACL(fd int) bool {
	_, err := unix.Fgetxattr(fd, "system.posix_acl_default", nil)
	return !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.EOPNOTSUPP)
}

// processUmask reads the umask from /proc/self/status (Linux 4.7+), since
// umask(2) can only read it by changing it, which would race with other
// goroutines creating files. Unknown, it masks everything, which turns
// the create-with-final-mode shortcut off.
func processUmask() uint32 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0o7777
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			if m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil {
				return uint32(m)
			}
		}
	}
	return 0o7777
}

// createdWithMode reports whether a file created in dir with mode ends up
// with exactly that mode, so that no chmod is needed after the create: no
// setuid, setgid or sticky bit is involved (a chown clears the first two,
// and nothing else of the mode), the umask removes nothing and no default
// ACL replaces the umask.
func (a *applier) createdWithMode(m dirMeta, mode uint32) bool {
	return mode&0o7000 == 0 && mode&a.umask == 0 && !m.defaultACL
}

// mkparent creates the missing directory rel (and its missing parents) the
// tar did not list. The metadata comes from the lowers when they have the
// directory, so that the new upper directory shows what the merged view
// showed before.
func (a *applier) mkparent(rel string) error {
	dir, base := splitRel(rel)
	parent, err := a.openDir(dir)
	if err != nil {
		return err
	}
	pfd := parent.fd
	mode, uid, gid := uint32(0o755), 0, 0
	var xattrs map[string][]byte
	var times *dirTimes
	if a.lowers != nil {
		n, err := a.lowers.lookupPath(rel)
		if err != nil {
			return err
		}
		if n.exists && n.isDir() {
			mode, uid, gid = n.st.Mode&0o7777, int(n.st.Uid), int(n.st.Gid)
			if xattrs, err = listXattrs(n.path); err != nil {
				return err
			}
			times = &dirTimes{atime: n.st.Atim, mtime: n.st.Mtim}
		}
	}
	if err := a.mkdirOver(pfd, base, true); err != nil {
		return fmt.Errorf("create parent directory %q: %w", rel, err)
	}
	if err := unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown parent directory %q: %w", rel, err)
	}
	if err := unix.Fchmodat(pfd, base, mode, 0); err != nil {
		return fmt.Errorf("chmod parent directory %q: %w", rel, err)
	}
	if len(xattrs) > 0 {
		if err := a.setXattrsAt(pfd, base, xattrs); err != nil {
			return err
		}
	}
	key, err := a.changedDir(pfd, base)
	if err != nil {
		return fmt.Errorf("create parent directory %q: %w", rel, err)
	}
	if times != nil {
		a.times[key] = *times
	}
	a.dirty[parent.key] = true
	a.dirty[key] = true
	return nil
}

// removeAt deletes whatever is at base in directory pfd, recursively for
// directories, without following symlinks.
func (a *applier) removeAt(pfd int, base string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("stat %q: %w", base, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		a.flushDirs()
		if err := removeTreeAt(pfd, base); err != nil {
			return err
		}
		return nil
	case unix.S_IFLNK:
		a.flushDirs()
	}
	if err := unix.Unlinkat(pfd, base, 0); err != nil {
		return fmt.Errorf("remove %q: %w", base, err)
	}
	return nil
}

// removeTreeAt removes the directory base of pfd and everything in it.
func removeTreeAt(pfd int, base string) error {
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %q for removal: %w", base, err)
	}
	f := os.NewFile(uintptr(fd), base)
	names, err := f.Readdirnames(-1)
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("list %q for removal: %w", base, err)
	}
	for _, name := range names {
		err := unix.Unlinkat(fd, name, 0)
		if errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EPERM) {
			err = removeTreeAt(fd, name)
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			_ = f.Close()
			return fmt.Errorf("remove %q in %q: %w", name, base, err)
		}
	}
	_ = f.Close()
	if err := unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR); err != nil {
		return fmt.Errorf("remove directory %q: %w", base, err)
	}
	return nil
}

func timespec(t time.Time) unix.Timespec {
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

func entryTimes(hdr *tar.Header) [2]unix.Timespec {
	at := hdr.AccessTime
	if at.IsZero() {
		at = hdr.ModTime
	}
	return [2]unix.Timespec{timespec(at), timespec(hdr.ModTime)}
}

// entryXattrs extracts the xattrs of hdr, refusing overlayfs' own.
func entryXattrs(hdr *tar.Header) (map[string][]byte, error) {
	var out map[string][]byte
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, paxXattrPrefix)
		if !ok {
			continue
		}
		if ovl.IsPrivate(name) {
			return nil, fmt.Errorf("xattr %s: %w", name, ErrOverlayXattr)
		}
		if name == "" {
			return nil, errors.New("xattr with an empty name")
		}
		if out == nil {
			out = make(map[string][]byte)
		}
		out[name] = []byte(v)
	}
	return out, nil
}

func checkIDs(hdr *tar.Header) error {
	const maxID = 1<<32 - 2 // -1 means "leave unchanged" to chown
	if hdr.Uid < 0 || hdr.Uid > maxID || hdr.Gid < 0 || hdr.Gid > maxID {
		return fmt.Errorf("owner %d:%d out of range", hdr.Uid, hdr.Gid)
	}
	return nil
}

func (a *applier) entry(hdr *tar.Header, tr *tar.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	rel, err := cleanEntryName(hdr.Name)
	if err != nil {
		return err
	}
	if m := a.limits.MaxDepth; m > 0 && rel != "" && strings.Count(rel, "/")+1 > m {
		return fmt.Errorf("%w of %d: %d path components", ErrTooDeep, m, strings.Count(rel, "/")+1)
	}
	dir, base := splitRel(rel)
	if skip, err := checkWhiteoutNames(dir, base, hdr.Typeflag); skip || err != nil {
		return err
	}
	if strings.HasPrefix(base, whiteoutPrefix) {
		return a.whiteout(dir, base, hdr)
	}
	if err := checkIDs(hdr); err != nil {
		return err
	}
	xattrs, err := entryXattrs(hdr)
	if err != nil {
		return err
	}
	if rel == "" {
		if hdr.Typeflag != tar.TypeDir {
			return errors.New("the layer root must be a directory")
		}
		return a.rootDir(hdr, xattrs)
	}
	parent, err := a.openDir(dir)
	if err != nil {
		return err
	}
	pfd := parent.fd
	a.dirty[parent.key] = true
	mode := uint32(hdr.Mode) & 0o7777
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeGNUSparse: // archive/tar reports TypeRegA as TypeReg
		m, err := a.dirMeta(parent)
		if err != nil {
			return err
		}
		return a.regular(pfd, base, hdr, tr, mode, xattrs, m)
	case tar.TypeDir:
		return a.directory(parent, base, hdr, mode, xattrs)
	case tar.TypeSymlink:
		return a.symlink(pfd, rel, base, hdr, xattrs)
	case tar.TypeLink:
		return a.hardlink(pfd, rel, base, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return a.special(pfd, base, hdr, mode, xattrs)
	}
	return fmt.Errorf("type %q: %w", hdr.Typeflag, ErrUnsupportedEntry)
}

// checkWhiteoutNames refuses an entry that uses a .wh. name anywhere the
// OCI layer format puts no whiteout: as a directory on the way to the
// entry (".wh.x/y", ".wh..wh..opq/z"), or as a directory entry itself.
// Applied, such a name would be a real file or directory that an export
// cannot write without it turning into a whiteout or an opaque marker when
// applied again. Entries at or below AUFS' own ".wh..wh." bookkeeping
// names (other than the opaque marker) describe nothing and are skipped.
func checkWhiteoutNames(dir, base string, typ byte) (skip bool, err error) {
	if dir != "" {
		for _, c := range strings.Split(dir, "/") {
			if !strings.HasPrefix(c, whiteoutPrefix) {
				continue
			}
			if strings.HasPrefix(c, whiteoutMetaPrefix) && c != whiteoutOpaque {
				return true, nil
			}
			return false, fmt.Errorf("%q in the path is a whiteout name, not a directory: %w", c, ErrInvalidWhiteout)
		}
	}
	if !strings.HasPrefix(base, whiteoutPrefix) {
		return false, nil
	}
	if strings.HasPrefix(base, whiteoutMetaPrefix) && base != whiteoutOpaque {
		return true, nil
	}
	if typ == tar.TypeDir {
		return false, fmt.Errorf("directory named like a whiteout: %w", ErrInvalidWhiteout)
	}
	return false, nil
}

// whiteout converts a .wh. entry: the opaque marker becomes an xattr on
// its directory, any other name a 0/0 character device owned as the entry
// says.
func (a *applier) whiteout(dir, base string, hdr *tar.Header) error {
	if base == whiteoutOpaque {
		d, err := a.openDir(dir)
		if err != nil {
			return err
		}
		if err := unix.Fsetxattr(d.fd, a.prefix+"opaque", []byte("y"), 0); err != nil {
			return fmt.Errorf("mark %q opaque: %w", dir, err)
		}
		a.dirty[d.key] = true
		// The root, however the tar reached it (l -> . makes l/ the root).
		if d.key == a.rootKey {
			a.rootOpaque = true
		}
		return nil
	}
	name := base[len(whiteoutPrefix):]
	if name == "" || name == "." || name == ".." {
		return ErrInvalidWhiteout
	}
	if err := checkIDs(hdr); err != nil {
		return err
	}
	parent, err := a.openDirMode(dir, openNoReplace)
	if err != nil {
		// A whiteout below a path this layer already whited out or
		// replaced by a file is redundant, not an error.
		if errors.Is(err, unix.ENOTDIR) {
			return nil
		}
		return err
	}
	pfd := parent.fd
	a.dirty[parent.key] = true
	if err := a.removeAt(pfd, name); err != nil {
		return err
	}
	if err := unix.Mknodat(pfd, name, unix.S_IFCHR, 0); err != nil {
		return fmt.Errorf("create whiteout %q: %w", name, err)
	}
	if err := unix.Fchownat(pfd, name, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown whiteout %q: %w", name, err)
	}
	return nil
}

func (a *applier) rootDir(hdr *tar.Header, xattrs map[string][]byte) error {
	if err := unix.Fchown(a.rootFd, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown root: %w", err)
	}
	if err := unix.Fchmod(a.rootFd, uint32(hdr.Mode)&0o7777); err != nil {
		return fmt.Errorf("chmod root: %w", err)
	}
	if err := a.setXattrsFd(a.rootFd, xattrs); err != nil {
		return err
	}
	delete(a.meta, a.rootKey)
	t := entryTimes(hdr)
	a.times[a.rootKey] = dirTimes{atime: t[0], mtime: t[1]}
	a.dirty[a.rootKey] = true
	return nil
}

func (a *applier) regular(pfd int, base string, hdr *tar.Header, tr *tar.Reader, mode uint32, xattrs map[string][]byte, m dirMeta) error {
	if hdr.Size < 0 {
		return fmt.Errorf("negative size %d", hdr.Size)
	}
	if m := a.limits.MaxSize; m > 0 && hdr.Size > m-a.size {
		return fmt.Errorf("%w of %d bytes: an entry of %d bytes after %d", ErrTooLarge, m, hdr.Size, a.size)
	}
	// A new file already has the owner most entries ask for (0:0 when
	// root applies), and usually the mode too: each skipped chown and
	// chmod saves a system call per file.
	chown := hdr.Uid != a.euid || hdr.Gid != m.newGid
	perm, chmod := uint32(0o600), true
	if a.createdWithMode(m, mode) {
		perm, chmod = mode, false
	}
	const flags = unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(pfd, base, flags, perm)
	if errors.Is(err, unix.EEXIST) {
		if err = a.removeAt(pfd, base); err != nil {
			return err
		}
		fd, err = unix.Openat(pfd, base, flags, perm)
	}
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	if sp := a.sparse; sp != nil {
		a.sparse = nil
		a.startDigest(DigestSparseSHA256)
		err = a.fillSparse(fd, sp, hdr.Size)
	} else {
		a.startDigest(DigestSHA256)
		err = a.fillFile(fd, tr, hdr.Size)
	}
	if err == nil {
		err = a.setMeta(fd, hdr, mode, xattrs, chown, chmod)
	}
	if err == nil {
		t := entryTimes(hdr)
		if err = futimens(fd, &t); err != nil {
			err = fmt.Errorf("set times: %w", err)
		}
	}
	if err == nil && a.opts.Sync {
		if err = unix.Fsync(fd); err != nil {
			err = fmt.Errorf("fsync: %w", err)
		}
	}
	if err == nil {
		err = a.endDigest(fd, hdr.Size)
	}
	if cerr := unix.Close(fd); err == nil && cerr != nil {
		err = fmt.Errorf("close: %w", cerr)
	}
	if err == nil {
		a.size += hdr.Size
	}
	return err
}

// startDigest readies the hash of a regular entry's data when the
// caller asked for digests.
func (a *applier) startDigest(algo DigestAlgo) {
	if a.opts.Digest == nil {
		return
	}
	a.hashing = algo
	a.sum.Reset()
	a.sparseSum.Reset()
}

// endDigest hands the digest of the file just written, open as fd, to
// opts.Digest.
func (a *applier) endDigest(fd int, size int64) error {
	algo := a.hashing
	a.hashing = ""
	if a.opts.Digest == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat: %w", err)
	}
	d := FileDigest{Dev: uint64(st.Dev), Ino: st.Ino, Size: size, Algo: algo}
	if algo == DigestSparseSHA256 {
		d.Sum = a.sparseSum.Sum(size)
	} else {
		a.sum.Sum(d.Sum[:0])
	}
	a.opts.Digest(d)
	return nil
}

// hashChunk feeds data the entry's hash as it streams through: the bytes
// at off of the file.
func (a *applier) hashChunk(p []byte, off int64) error {
	switch a.hashing {
	case DigestSHA256:
		a.sum.Write(p)
	case DigestSparseSHA256:
		if !a.sparseSum.WriteAt(p, off) {
			return fmt.Errorf("sparse data at %d before the end of the previous fragment", off)
		}
	}
	return nil
}

// fillFile copies size bytes of r into fd. Whole blocks of zeros are not
// written, so that runs of zeros become holes; the final truncate gives
// the file its length. Sparse entries go through fillSparse instead.
func (a *applier) fillFile(fd int, r io.Reader, size int64) error {
	holeAtEnd, err := a.copyRange(fd, r, 0, size)
	if err != nil {
		return err
	}
	if holeAtEnd {
		if err := unix.Ftruncate(fd, size); err != nil {
			return fmt.Errorf("truncate to %d: %w", size, err)
		}
	}
	return nil
}

// fillSparse writes the data fragments of a sparse entry, read from the
// stream itself, at their offsets and gives the file its length: the
// holes are never read or written, whatever size they declare. The
// placeholder bytes owed to archive/tar make it skip the same data.
func (a *applier) fillSparse(fd int, sp *sparseEntry, size int64) error {
	for _, d := range sp.data {
		if _, err := a.copyRange(fd, a.stream.r, d.offset, d.length); err != nil {
			return err
		}
	}
	a.stream.owed = sp.physical
	if err := unix.Ftruncate(fd, size); err != nil {
		return fmt.Errorf("truncate to %d: %w", size, err)
	}
	return nil
}

// copyRange copies size bytes of r into fd at base, leaving whole blocks
// of zeros unwritten; it reports whether the range ends in such a block.
func (a *applier) copyRange(fd int, r io.Reader, base, size int64) (bool, error) {
	var off int64
	holeAtEnd := false
	for off < size {
		if err := a.ctx.Err(); err != nil {
			return false, err
		}
		n := int64(len(a.buf))
		if size-off < n {
			n = size - off
		}
		m, err := io.ReadFull(r, a.buf[:n])
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return false, fmt.Errorf("read content at offset %d of %d: %w", base+off, size, err)
		}
		chunk := a.buf[:m]
		if err := a.hashChunk(chunk, base+off); err != nil {
			return false, err
		}
		// Walk the chunk in hole-sized blocks, writing each run of
		// non-zero blocks with one pwrite.
		start := -1
		for i := 0; i < len(chunk); i += holeBlock {
			end := min(i+holeBlock, len(chunk))
			if bytes.Equal(chunk[i:end], zeroBlock[:end-i]) {
				if start >= 0 {
					if err := pwriteAll(fd, chunk[start:i], base+off+int64(start)); err != nil {
						return false, err
					}
					start = -1
				}
				holeAtEnd = true
				continue
			}
			holeAtEnd = false
			if start < 0 {
				start = i
			}
		}
		if start >= 0 {
			if err := pwriteAll(fd, chunk[start:], base+off+int64(start)); err != nil {
				return false, err
			}
		}
		off += int64(m)
	}
	return holeAtEnd, nil
}

// futimens sets the times of an open file: utimensat with a NULL path,
// which saves the lookup of the name again.
func futimens(fd int, ts *[2]unix.Timespec) error {
	_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func pwriteAll(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if err != nil {
			return fmt.Errorf("write at offset %d: %w", off, err)
		}
		b = b[n:]
		off += int64(n)
	}
	return nil
}

// setMeta gives an open file its owner, mode and xattrs, in that order:
// chown clears setuid bits and security.capability, so both come after it.
func (a *applier) setMeta(fd int, hdr *tar.Header, mode uint32, xattrs map[string][]byte, chown, chmod bool) error {
	if chown {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("chown %d:%d: %w", hdr.Uid, hdr.Gid, err)
		}
	}
	if chmod {
		if err := unix.Fchmod(fd, mode); err != nil {
			return fmt.Errorf("chmod %o: %w", mode, err)
		}
	}
	return a.setXattrsFd(fd, xattrs)
}

// xattrErr decides whether a failed setxattr fails the layer. A
// filesystem without support for a namespace (user.* on tmpfs before 6.6)
// loses that xattr, as with every other unpacker; a lost file capability
// would silently break the program, so that one is an error.
func xattrErr(name string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.EOPNOTSUPP) && name != "security.capability" {
		return nil
	}
	return fmt.Errorf("set xattr %s: %w", name, err)
}

func sortedKeys(m map[string][]byte) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (a *applier) setXattrsFd(fd int, xattrs map[string][]byte) error {
	for _, k := range sortedKeys(xattrs) {
		if err := xattrErr(k, unix.Fsetxattr(fd, k, xattrs[k], 0)); err != nil {
			return err
		}
	}
	return nil
}

// setXattrsAt sets xattrs on base in pfd without following it, through
// the descriptor's /proc path: there is no fd-relative lsetxattr, and a
// symlink or device cannot be opened to use fsetxattr.
func (a *applier) setXattrsAt(pfd int, base string, xattrs map[string][]byte) error {
	p := "/proc/self/fd/" + strconv.Itoa(pfd) + "/" + base
	for _, k := range sortedKeys(xattrs) {
		if err := xattrErr(k, unix.Lsetxattr(p, k, xattrs[k], 0)); err != nil {
			return err
		}
	}
	return nil
}

func (a *applier) directory(parent dirRef, base string, hdr *tar.Header, mode uint32, xattrs map[string][]byte) error {
	pfd := parent.fd
	if err := a.mkdirOver(pfd, base, false); err != nil {
		return err
	}
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown %d:%d: %w", hdr.Uid, hdr.Gid, err)
	}
	if err := unix.Fchmodat(pfd, base, mode, 0); err != nil {
		return fmt.Errorf("chmod %o: %w", mode, err)
	}
	key, err := a.changedDir(pfd, base)
	if err != nil {
		return err
	}
	if len(xattrs) > 0 {
		if err := a.setXattrsAt(pfd, base, xattrs); err != nil {
			return err
		}
	}
	t := entryTimes(hdr)
	a.times[key] = dirTimes{atime: t[0], mtime: t[1]}
	a.dirty[key] = true
	return nil
}

// mkdirOver makes base a directory. An existing directory is kept: it may
// already hold entries or an opaque marker from earlier in this tar. Any
// other entry is replaced; when that entry is a whiteout, the new
// directory is marked opaque, as overlayfs marks a directory created over
// a whiteout, so that what the layer deleted below stays deleted.
//
// An implicit parent (one the tar did not list) only replaces a whiteout:
// a file in the way of a path is an error in the tar, not something to
// delete.
func (a *applier) mkdirOver(pfd int, base string, implicit bool) error {
	err := unix.Mkdirat(pfd, base, 0o700)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("mkdir %q: %w", base, err)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("stat existing %q: %w", base, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil
	}
	whiteout := st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
	if implicit && !whiteout {
		return fmt.Errorf("parent %q: %w", base, unix.ENOTDIR)
	}
	if err := a.removeAt(pfd, base); err != nil {
		return err
	}
	if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
		return fmt.Errorf("mkdir %q: %w", base, err)
	}
	if whiteout {
		p := "/proc/self/fd/" + strconv.Itoa(pfd) + "/" + base
		if err := unix.Lsetxattr(p, a.prefix+"opaque", []byte("y"), 0); err != nil {
			return fmt.Errorf("mark %q opaque: %w", base, err)
		}
	}
	return nil
}

// climbs reports whether a relative symlink target has a ".." component.
// Only such a target can resolve above the root: one without climbs only
// through other symlinks, and those that climb are checked themselves.
func climbs(target string) bool {
	if strings.HasPrefix(target, "/") {
		return false
	}
	for _, c := range strings.Split(target, "/") {
		if c == ".." {
			return true
		}
	}
	return false
}

// linkEscapes reports whether the relative symlink target, in the
// directory dir (a path of real directories beneath the root), resolves
// above the root, following the layer's own symlinks as the kernel would.
// Counting components is not enough: with d -> ., d/.. is the root's
// parent. A relative link that climbs above the root is refused as
// go-archive refuses it; absolute targets are kept, they name paths in
// the container's root, and so does a relative target once it reaches an
// absolute link. A missing component is taken as a directory, so that
// what a later layer creates there cannot make the link climb; a link
// that loops never resolves and climbs nowhere.
func (a *applier) linkEscapes(dir, target string) (bool, error) {
	var stack []string // resolved components; never a symlink
	if dir != "" {
		stack = strings.Split(dir, "/")
	}
	pending := strings.Split(target, "/")
	for hops := 0; len(pending) > 0; {
		c := pending[0]
		pending = pending[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(stack) == 0 {
				return true, nil
			}
			stack = stack[:len(stack)-1]
			continue
		}
		// Every component of p is a directory or missing, so this looks
		// up exactly the path the kernel would reach.
		p := strings.Join(append(stack[:len(stack):len(stack)], c), "/")
		var st unix.Stat_t
		err := unix.Fstatat(a.rootFd, p, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) && !errors.Is(err, unix.ENAMETOOLONG) {
			return false, fmt.Errorf("resolve %q: %w", p, err)
		}
		if err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
			stack = append(stack, c)
			continue
		}
		if hops++; hops > 40 { // the kernel's limit, ELOOP beyond
			return false, nil
		}
		next, err := readlinkAt(a.rootFd, p)
		if err != nil {
			return false, err
		}
		if strings.HasPrefix(next, "/") {
			return false, nil
		}
		pending = append(strings.Split(next, "/"), pending...)
	}
	return false, nil
}

func readlinkAt(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", fmt.Errorf("readlink %q: %w", name, err)
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

func (a *applier) symlink(pfd int, rel, base string, hdr *tar.Header, xattrs map[string][]byte) error {
	if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 {
		return fmt.Errorf("symlink target %q: %w", hdr.Linkname, ErrUnsafePath)
	}
	err := unix.Symlinkat(hdr.Linkname, pfd, base)
	if errors.Is(err, unix.EEXIST) {
		if err = a.removeAt(pfd, base); err != nil {
			return err
		}
		err = unix.Symlinkat(hdr.Linkname, pfd, base)
	}
	if err != nil {
		return fmt.Errorf("symlink: %w", err)
	}
	if climbs(hdr.Linkname) {
		// Where the target leads depends on entries that may still come;
		// finish checks it on the whole tree and names this entry.
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("stat symlink: %w", err)
		}
		a.links[statKey(&st)] = hdr.Name
	}
	return a.finishAt(pfd, base, hdr, xattrs)
}

// finishAt sets owner, xattrs and times of a non-regular, non-directory
// entry by name, never following it.
func (a *applier) finishAt(pfd int, base string, hdr *tar.Header, xattrs map[string][]byte) error {
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown %d:%d: %w", hdr.Uid, hdr.Gid, err)
	}
	if len(xattrs) > 0 {
		if err := a.setXattrsAt(pfd, base, xattrs); err != nil {
			return err
		}
	}
	t := entryTimes(hdr)
	if err := unix.UtimesNanoAt(pfd, base, t[:], unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

func (a *applier) hardlink(pfd int, rel, base string, hdr *tar.Header) error {
	target, err := cleanEntryName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
	}
	if target == "" || target == rel {
		return fmt.Errorf("hard link to %q: %w", hdr.Linkname, ErrUnsafePath)
	}
	tdir, tbase := splitRel(target)
	td, err := a.openDir(tdir)
	if err != nil {
		return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
	}
	tfd := td.fd
	// linkat without AT_SYMLINK_FOLLOW links a symlink itself, never
	// what it points to, so a link named after a symlink cannot reach
	// outside the root.
	err = unix.Linkat(tfd, tbase, pfd, base, 0)
	if errors.Is(err, unix.EEXIST) {
		if err = a.removeAt(pfd, base); err != nil {
			return err
		}
		err = unix.Linkat(tfd, tbase, pfd, base, 0)
	}
	if err != nil {
		return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
	}
	return nil
}

func (a *applier) special(pfd int, base string, hdr *tar.Header, mode uint32, xattrs map[string][]byte) error {
	var kind uint32
	var dev uint64
	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		if hdr.Devmajor < 0 || hdr.Devmajor > 0xfff || hdr.Devminor < 0 || hdr.Devminor > 0xfffff {
			return fmt.Errorf("device %d:%d out of range", hdr.Devmajor, hdr.Devminor)
		}
		kind = unix.S_IFCHR
		if hdr.Typeflag == tar.TypeBlock {
			kind = unix.S_IFBLK
		}
		dev = unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
	default:
		kind = unix.S_IFIFO
	}
	err := unix.Mknodat(pfd, base, kind|mode, int(dev))
	if errors.Is(err, unix.EEXIST) {
		if err = a.removeAt(pfd, base); err != nil {
			return err
		}
		err = unix.Mknodat(pfd, base, kind|mode, int(dev))
	}
	if err != nil {
		return fmt.Errorf("mknod: %w", err)
	}
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown %d:%d: %w", hdr.Uid, hdr.Gid, err)
	}
	// mknod applied the umask; the node is not a symlink, so following
	// is moot.
	if err := unix.Fchmodat(pfd, base, mode, 0); err != nil {
		return fmt.Errorf("chmod %o: %w", mode, err)
	}
	return a.finishAt(pfd, base, hdr, xattrs)
}

// finish sets directory times (creating entries inside a directory moves
// its mtime, so they can only be set last), checks symlinks that climb
// against the final tree and, with Sync, flushes every directory the
// layer touched.
func (a *applier) finish() error {
	if a.rootOpaque && a.lowers != nil {
		if err := a.whiteoutLowerRoot(); err != nil {
			return err
		}
	}
	fd, err := unix.Openat(a.rootFd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("layer: open root: %w", err)
	}
	return a.finishDir(fd, "")
}

// finishDir walks the final tree below the directory fd (at rel, closed
// on return) without following symlinks. It checks symlinks that climb,
// then sets the directory's times (after reading it, which moves its
// atime) and, with Sync, flushes it. Walking what is there, rather than
// the paths the tar used, reaches each directory exactly as the tar left
// it: one whited out or replaced by a later entry is not there to set or
// to bring back, and one reached through an alias has one identity.
func (a *applier) finishDir(fd int, rel string) error {
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	// Entry names are checked against MaxDepth as they come; symlinks on
	// the way of a name can put a directory deeper than its name says.
	if m := a.limits.MaxDepth; m > 0 && rel != "" && strings.Count(rel, "/")+1 > m {
		return fmt.Errorf("layer: directory %.200q...: %w of %d", rel, ErrTooDeep, m)
	}
	entries, err := f.ReadDir(-1)
	if err != nil {
		return fmt.Errorf("layer: list %q: %w", rel, err)
	}
	for _, e := range entries {
		if err := a.ctx.Err(); err != nil {
			return fmt.Errorf("layer: apply: %w", err)
		}
		p := path.Join(rel, e.Name())
		switch e.Type() {
		case fs.ModeDir:
			cfd, err := unix.Openat(fd, e.Name(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("layer: open %q: %w", p, err)
			}
			if err := a.finishDir(cfd, p); err != nil {
				return err
			}
		case fs.ModeSymlink:
			if err := a.checkLink(fd, rel, e.Name()); err != nil {
				return err
			}
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("layer: stat %q: %w", rel, err)
	}
	key := statKey(&st)
	if t, ok := a.times[key]; ok {
		ts := [2]unix.Timespec{t.atime, t.mtime}
		if err := futimens(fd, &ts); err != nil {
			return fmt.Errorf("layer: set times of %q: %w", rel, err)
		}
	}
	if a.opts.Sync && a.dirty[key] {
		if err := unix.Fsync(fd); err != nil {
			return fmt.Errorf("layer: fsync %q: %w", filepath.Join(a.root, rel), err)
		}
	}
	return nil
}

// checkLink refuses the symlink name in the directory fd (at rel) when
// its target climbs above the root, naming the tar entry that made it.
func (a *applier) checkLink(fd int, rel, name string) error {
	target, err := readlinkAt(fd, name)
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	if !climbs(target) {
		return nil
	}
	p := path.Join(rel, name)
	escapes, err := a.linkEscapes(rel, target)
	if err != nil {
		return fmt.Errorf("layer: symlink %q: %w", p, err)
	}
	if !escapes {
		return nil
	}
	entry := p
	var st unix.Stat_t
	if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		if n, ok := a.links[statKey(&st)]; ok {
			entry = n
		}
	}
	return &EntryError{Name: entry, Err: fmt.Errorf("symlink %q to %q resolves outside the root: %w", p, target, ErrUnsafePath)}
}

// whiteoutLowerRoot hides every entry of the lowers' merged root that the
// layer does not replace itself.
func (a *applier) whiteoutLowerRoot() error {
	root, err := a.lowers.root()
	if err != nil {
		return fmt.Errorf("layer: opaque root: %w", err)
	}
	names, err := a.lowers.names(root)
	if err != nil {
		return fmt.Errorf("layer: opaque root: %w", err)
	}
	for _, name := range names {
		n, err := a.lowers.lookup(root, name)
		if err != nil {
			return fmt.Errorf("layer: opaque root: %w", err)
		}
		if !n.exists {
			continue
		}
		var st unix.Stat_t
		err = unix.Fstatat(a.rootFd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil {
			// The layer's own entry hides the lower one, except that a
			// directory would merge with a lower directory.
			if st.Mode&unix.S_IFMT == unix.S_IFDIR && n.isDir() {
				p := "/proc/self/fd/" + strconv.Itoa(a.rootFd) + "/" + name
				if err := unix.Lsetxattr(p, a.prefix+"opaque", []byte("y"), 0); err != nil {
					return fmt.Errorf("layer: opaque root: mark %q opaque: %w", name, err)
				}
			}
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("layer: opaque root: stat %q: %w", name, err)
		}
		if err := unix.Mknodat(a.rootFd, name, unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("layer: opaque root: whiteout %q: %w", name, err)
		}
	}
	return nil
}
