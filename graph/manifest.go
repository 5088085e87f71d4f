package graph

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/ovlkit/ovlkit/layer"
	"golang.org/x/sys/unix"
)

// A manifest lists what a layer's diff held when ApplyDiff published it:
// one record per entry, sorted by path, framed by a header and a trailer
// that carries the record count and the SHA-256 of everything before it.
// It lives in the layer directory (layers/<id>/manifest), is written in
// the stage before the layer is published and made durable with it, so
// a published layer always has the manifest of what it was published
// with. Documentation/graph.rst describes the format.
//
//	ovlkit-manifest 1
//	d / 0755 0 0
//	f /bin/sh 0755 0 0 125688 sha256:<64 hex>
//	h /bin/sh.hard /bin/sh
//	l /lib 0777 0 0 usr/lib
//	c /dev/null 0666 0 0 1 3
//	d /etc 0755 0 0 trusted.overlay.opaque=y
//	end 6 <64 hex: SHA-256 of the lines above>
const (
	manifestName    = "manifest"
	manifestMagic   = "ovlkit-manifest"
	manifestVersion = 1
	// maxManifestLine bounds one record: a path of at most PATH_MAX
	// bytes and xattrs of at most 64 KiB each, escaped.
	maxManifestLine = 4 << 20
)

// Record types: what lstat says, and 'h' for a further name of a file
// recorded under an earlier path (a hard link).
const (
	mDir      = 'd'
	mFile     = 'f'
	mSymlink  = 'l'
	mChar     = 'c'
	mBlock    = 'b'
	mFifo     = 'p'
	mSocket   = 's'
	mHardlink = 'h'
)

var typeNames = map[byte]string{
	mDir: "directory", mFile: "regular file", mSymlink: "symlink", mChar: "character device",
	mBlock: "block device", mFifo: "fifo", mSocket: "socket", mHardlink: "hard link",
}

// mentry is one record of a manifest.
type mentry struct {
	Type     byte
	Path     string // "/" or "/a/b"
	Mode     uint32 // permission, setuid, setgid and sticky bits
	UID, GID uint32
	Size     int64  // regular files
	Digest   string // regular files: "sha256:<hex>" or "sparse-sha256:<hex>"
	Target   string // symlinks: the target; hard links: the first path
	Major    uint32 // devices
	Minor    uint32
	Xattrs   []xattr // sorted by name
}

type xattr struct {
	Name  string
	Value []byte
}

// describe names the entry's type for messages, whiteouts included.
func (e *mentry) describe() string {
	if e.Type == mChar && e.Major == 0 && e.Minor == 0 {
		return "whiteout"
	}
	return typeNames[e.Type]
}

// escapeField writes s so that it holds no space, newline, '=' or '%' and
// only printable ASCII: every other byte as %XX.
func escapeField(b *bytes.Buffer, s string) {
	const hexdig = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == '%' || c == '=' {
			b.WriteByte('%')
			b.WriteByte(hexdig[c>>4])
			b.WriteByte(hexdig[c&15])
			continue
		}
		b.WriteByte(c)
	}
}

// unescapeField reverses escapeField and refuses any other spelling of
// the same bytes, so that one manifest has one encoding.
func unescapeField(f string) (string, error) {
	if !strings.Contains(f, "%") {
		for i := 0; i < len(f); i++ {
			if c := f[i]; c <= ' ' || c >= 0x7f || c == '=' {
				return "", fmt.Errorf("byte %#x must be escaped", c)
			}
		}
		return f, nil
	}
	var out strings.Builder
	for i := 0; i < len(f); i++ {
		c := f[i]
		if c != '%' {
			if c <= ' ' || c >= 0x7f || c == '=' {
				return "", fmt.Errorf("byte %#x must be escaped", c)
			}
			out.WriteByte(c)
			continue
		}
		if i+2 >= len(f) {
			return "", errors.New("truncated %-escape")
		}
		v, err := strconv.ParseUint(f[i+1:i+3], 16, 8)
		if err != nil || strings.ToUpper(f[i+1:i+3]) != f[i+1:i+3] {
			return "", fmt.Errorf("bad %%-escape %q", f[i:i+3])
		}
		d := byte(v)
		if d > ' ' && d < 0x7f && d != '%' && d != '=' {
			return "", fmt.Errorf("%%-escape %q of a byte that needs none", f[i:i+3])
		}
		out.WriteByte(d)
		i += 2
	}
	return out.String(), nil
}

// encodeRecord appends e's line to b.
func encodeRecord(b *bytes.Buffer, e *mentry) {
	b.WriteByte(e.Type)
	b.WriteByte(' ')
	escapeField(b, e.Path)
	if e.Type == mHardlink {
		b.WriteByte(' ')
		escapeField(b, e.Target)
		b.WriteByte('\n')
		return
	}
	fmt.Fprintf(b, " %04o %d %d", e.Mode, e.UID, e.GID)
	switch e.Type {
	case mFile:
		fmt.Fprintf(b, " %d %s", e.Size, e.Digest)
	case mSymlink:
		b.WriteByte(' ')
		escapeField(b, e.Target)
	case mChar, mBlock:
		fmt.Fprintf(b, " %d %d", e.Major, e.Minor)
	}
	for _, x := range e.Xattrs {
		b.WriteByte(' ')
		escapeField(b, x.Name)
		b.WriteByte('=')
		escapeField(b, string(x.Value))
	}
	b.WriteByte('\n')
}

// encodeManifest is the whole manifest of entries, which must be sorted
// by path.
func encodeManifest(entries []mentry) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %d\n", manifestMagic, manifestVersion)
	for i := range entries {
		encodeRecord(&b, &entries[i])
	}
	sum := sha256.Sum256(b.Bytes())
	fmt.Fprintf(&b, "end %d %s\n", len(entries), hex.EncodeToString(sum[:]))
	return b.Bytes()
}

// errManifest marks a manifest that cannot be read: missing, cut short,
// damaged, or of a version this build does not know.
var errManifest = errors.New("bad manifest")

// decodeManifest reads a manifest and checks everything the format
// promises: the header, the trailer's count and checksum, records sorted
// and unique by path, every path's parent a directory record, every hard
// link naming an earlier record that is not a directory.
func decodeManifest(r io.Reader) ([]mentry, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	h := sha256.New()
	var (
		entries []mentry
		kinds   = map[string]byte{}
		lineNo  int
	)
	fail := func(f string, a ...any) ([]mentry, error) {
		return nil, fmt.Errorf("%w: line %d: %s", errManifest, lineNo, fmt.Sprintf(f, a...))
	}
	// Zeros where a crash lost the data, or another file: say so
	// rather than what the first line lacks.
	if head, _ := br.Peek(len(manifestMagic)); len(head) > 0 && string(head) != manifestMagic {
		return nil, fmt.Errorf("%w: not a manifest (starts with %.16q)", errManifest, head)
	}
	for {
		line, err := readLine(br)
		lineNo++
		if errors.Is(err, io.EOF) {
			return fail("ends without its trailer (cut short?)")
		}
		if err != nil {
			return fail("%v", err)
		}
		if lineNo == 1 {
			if line != fmt.Sprintf("%s %d", manifestMagic, manifestVersion) {
				if v, ok := strings.CutPrefix(line, manifestMagic+" "); ok {
					return fail("version %.20q, this build reads %d", v, manifestVersion)
				}
				return fail("not a manifest (header %.40q)", line)
			}
			h.Write([]byte(line + "\n"))
			continue
		}
		if rest, ok := strings.CutPrefix(line, "end "); ok {
			return finishManifest(br, h.Sum(nil), rest, entries, lineNo)
		}
		h.Write([]byte(line + "\n"))
		e, err := decodeRecord(line)
		if err != nil {
			return fail("%v", err)
		}
		if n := len(entries); n > 0 && entries[n-1].Path >= e.Path {
			return fail("%q after %q: records must be sorted and unique", e.Path, entries[n-1].Path)
		}
		if e.Path != "/" {
			parent := filepath.Dir(e.Path)
			if kinds[parent] != mDir {
				return fail("%q: its parent is not a directory record", e.Path)
			}
		} else if e.Type != mDir {
			return fail("the root is a %s", e.describe())
		}
		if e.Type == mHardlink {
			k, ok := kinds[e.Target]
			if !ok || k == mDir || k == mHardlink {
				return fail("hard link %q to %q, which is no earlier file record", e.Path, e.Target)
			}
		}
		kinds[e.Path] = e.Type
		entries = append(entries, e)
	}
}

// finishManifest checks the trailer and that nothing follows it.
func finishManifest(br *bufio.Reader, sum []byte, trailer string, entries []mentry, lineNo int) ([]mentry, error) {
	n, hexSum, ok := strings.Cut(trailer, " ")
	count, err := strconv.Atoi(n)
	if !ok || err != nil || strconv.Itoa(count) != n {
		return nil, fmt.Errorf("%w: line %d: malformed trailer", errManifest, lineNo)
	}
	if count != len(entries) {
		return nil, fmt.Errorf("%w: trailer counts %d records, the manifest holds %d", errManifest, count, len(entries))
	}
	if hexSum != hex.EncodeToString(sum) {
		return nil, fmt.Errorf("%w: checksum mismatch (damaged)", errManifest)
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: data after the trailer", errManifest)
	}
	return entries, nil
}

// readLine returns the next line without its newline; a last line without
// one is a cut manifest.
func readLine(br *bufio.Reader) (string, error) {
	var b []byte
	for {
		chunk, err := br.ReadSlice('\n')
		b = append(b, chunk...)
		if len(b) > maxManifestLine {
			return "", fmt.Errorf("line longer than %d bytes", maxManifestLine)
		}
		if err == nil {
			return string(b[:len(b)-1]), nil
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) && len(b) > 0 {
			return "", errors.New("last line has no newline (cut short?)")
		}
		return "", err
	}
}

// decodeRecord parses one record line.
func decodeRecord(line string) (mentry, error) {
	var e mentry
	f := strings.Split(line, " ")
	if len(f) < 2 || len(f[0]) != 1 || typeNames[f[0][0]] == "" {
		return e, fmt.Errorf("unknown record %.40q", line)
	}
	e.Type = f[0][0]
	p, err := unescapeField(f[1])
	if err != nil {
		return e, fmt.Errorf("path: %w", err)
	}
	if err := checkManifestPath(p); err != nil {
		return e, err
	}
	e.Path = p
	if e.Type == mHardlink {
		return e, e.decodeHardlink(f)
	}
	fixed := map[byte]int{mFile: 2, mSymlink: 1, mChar: 2, mBlock: 2}[e.Type]
	if len(f) < 5+fixed {
		return e, fmt.Errorf("%q: %d fields, a %s record has at least %d", p, len(f), typeNames[e.Type], 5+fixed)
	}
	if err := e.decodeAttrs(f[2], f[3], f[4]); err != nil {
		return e, fmt.Errorf("%q: %w", p, err)
	}
	if err := e.decodeTypeFields(f[5 : 5+fixed]); err != nil {
		return e, fmt.Errorf("%q: %w", p, err)
	}
	if err := e.decodeXattrs(f[5+fixed:]); err != nil {
		return e, fmt.Errorf("%q: %w", p, err)
	}
	return e, nil
}

// decodeHardlink reads the target of a hard link record: "h PATH TARGET".
func (e *mentry) decodeHardlink(f []string) error {
	if len(f) != 3 {
		return fmt.Errorf("%q: a hard link record has 3 fields, not %d", e.Path, len(f))
	}
	var err error
	if e.Target, err = unescapeField(f[2]); err != nil {
		return fmt.Errorf("%q: target: %w", e.Path, err)
	}
	if err := checkManifestPath(e.Target); err != nil {
		return fmt.Errorf("%q: target: %w", e.Path, err)
	}
	return nil
}

// decodeAttrs reads the mode (four octal digits), uid and gid every other
// record has.
func (e *mentry) decodeAttrs(mode, uid, gid string) error {
	m, err := strconv.ParseUint(mode, 8, 32)
	if err != nil || m > 0o7777 || len(mode) != 4 {
		return fmt.Errorf("mode %.20q", mode)
	}
	e.Mode = uint32(m)
	if e.UID, err = parseID(uid); err != nil {
		return fmt.Errorf("uid: %w", err)
	}
	if e.GID, err = parseID(gid); err != nil {
		return fmt.Errorf("gid: %w", err)
	}
	return nil
}

// decodeTypeFields reads the fields of the record's type: a file's size
// and digest, a symlink's target, a device's numbers.
func (e *mentry) decodeTypeFields(f []string) error {
	var err error
	switch e.Type {
	case mFile:
		size, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || size < 0 || strconv.FormatInt(size, 10) != f[0] {
			return fmt.Errorf("size %.30q", f[0])
		}
		e.Size = size
		if err := checkDigest(f[1]); err != nil {
			return err
		}
		e.Digest = f[1]
	case mSymlink:
		if e.Target, err = unescapeField(f[0]); err != nil || e.Target == "" {
			return fmt.Errorf("symlink target: %v", err)
		}
	case mChar, mBlock:
		if e.Major, err = parseID(f[0]); err != nil {
			return fmt.Errorf("major: %w", err)
		}
		if e.Minor, err = parseID(f[1]); err != nil {
			return fmt.Errorf("minor: %w", err)
		}
	}
	return nil
}

// decodeXattrs reads NAME=VALUE fields, sorted by name and unique.
func (e *mentry) decodeXattrs(f []string) error {
	for _, x := range f {
		n, v, ok := strings.Cut(x, "=")
		if !ok {
			return fmt.Errorf("xattr %.40q without '='", x)
		}
		name, err := unescapeField(n)
		if err != nil || name == "" {
			return fmt.Errorf("xattr name %.40q: %v", n, err)
		}
		val, err := unescapeField(v)
		if err != nil {
			return fmt.Errorf("xattr %q: %w", name, err)
		}
		if k := len(e.Xattrs); k > 0 && e.Xattrs[k-1].Name >= name {
			return errors.New("xattrs must be sorted and unique")
		}
		e.Xattrs = append(e.Xattrs, xattr{name, []byte(val)})
	}
	return nil
}

func parseID(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil || strconv.FormatUint(v, 10) != s {
		return 0, fmt.Errorf("%.20q is not a decimal number below 2^32", s)
	}
	return uint32(v), nil
}

// checkManifestPath accepts "/" and clean absolute paths.
func checkManifestPath(p string) error {
	if p == "/" {
		return nil
	}
	if !strings.HasPrefix(p, "/") || filepath.Clean(p) != p || strings.IndexByte(p, 0) >= 0 {
		return fmt.Errorf("path %q is not clean and absolute", p)
	}
	return nil
}

func checkDigest(d string) error {
	algo, sum, ok := strings.Cut(d, ":")
	if !ok || (algo != string(layer.DigestSHA256) && algo != string(layer.DigestSparseSHA256)) {
		return fmt.Errorf("digest %.80q: unknown algorithm", d)
	}
	if b, err := hex.DecodeString(sum); err != nil || len(b) != sha256.Size || hex.EncodeToString(b) != sum {
		return fmt.Errorf("digest %.80q: want %d lower-case hex digits", d, 2*sha256.Size)
	}
	return nil
}

func formatDigest(algo layer.DigestAlgo, sum [sha256.Size]byte) string {
	return string(algo) + ":" + hex.EncodeToString(sum[:])
}

// readManifest reads the manifest of the layer directory ldir.
func readManifest(ldir string) ([]mentry, error) {
	f, err := os.Open(filepath.Join(ldir, manifestName))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: missing", errManifest)
		}
		return nil, fmt.Errorf("%w: %w", errManifest, err)
	}
	defer f.Close()
	return decodeManifest(f)
}

// writeManifest writes entries as the manifest of the layer directory
// ldir: in a new file renamed into place, fsynced when sync says so, so
// that a crash leaves the old manifest or the new one. A layer being
// staged is made durable with its stage instead.
func writeManifest(ldir string, entries []mentry, sync bool, log *slog.Logger) error {
	tmp, err := os.CreateTemp(ldir, ".manifest-*")
	if err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			logCleanup(log, "remove unfinished manifest", os.Remove(tmp.Name()))
		}
	}()
	if _, err := tmp.Write(encodeManifest(entries)); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	if sync {
		if err := tmp.Sync(); err != nil {
			return fmt.Errorf("fsync manifest: %w", err)
		}
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(ldir, manifestName)); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	ok = true
	if sync {
		return syncDir(ldir)
	}
	return nil
}

// ignoredXattrs are set by the system rather than by the layer, and
// changed by it (a relabel) without damage.
var ignoredXattrs = map[string]bool{"security.selinux": true}

// scanTree describes the tree at root as manifest records, sorted by
// path, without the digests of regular files (see fillDigests). A file
// reached by several names is recorded once, under the first of them,
// and its other names as hard links.
func scanTree(ctx context.Context, root string) ([]mentry, []inodeID, error) {
	var (
		entries []mentry
		ids     []inodeID
	)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("lstat %s: %w", p, err)
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		e := mentry{Path: "/" + filepath.ToSlash(rel), Mode: st.Mode & 0o7777, UID: st.Uid, GID: st.Gid}
		if rel == "." {
			e.Path = "/"
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			e.Type = mDir
		case unix.S_IFREG:
			e.Type, e.Size = mFile, st.Size
		case unix.S_IFLNK:
			e.Type = mSymlink
			if e.Target, err = os.Readlink(p); err != nil {
				return fmt.Errorf("readlink %s: %w", p, err)
			}
		case unix.S_IFCHR, unix.S_IFBLK:
			e.Type = mChar
			if st.Mode&unix.S_IFMT == unix.S_IFBLK {
				e.Type = mBlock
			}
			e.Major, e.Minor = unix.Major(st.Rdev), unix.Minor(st.Rdev)
		case unix.S_IFIFO:
			e.Type = mFifo
		default:
			e.Type = mSocket
		}
		if e.Xattrs, err = listXattrs(p); err != nil {
			return err
		}
		entries = append(entries, e)
		ids = append(ids, inodeID{uint64(st.Dev), st.Ino, st.Nlink > 1 && e.Type != mDir})
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("scan %s: %w", root, err)
	}
	idx := make([]int, len(entries))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return entries[idx[a]].Path < entries[idx[b]].Path })
	sorted := make([]mentry, len(entries))
	sortedIDs := make([]inodeID, len(entries))
	first := map[inodeID]string{}
	for i, j := range idx {
		sorted[i], sortedIDs[i] = entries[j], ids[j]
		if id := ids[j]; id.linked {
			if p, ok := first[id]; ok {
				sorted[i] = mentry{Type: mHardlink, Path: entries[j].Path, Target: p}
				continue
			}
			first[id] = entries[j].Path
		}
	}
	return sorted, sortedIDs, nil
}

// inodeID identifies a file of a scanned tree; linked says it has more
// than one name somewhere.
type inodeID struct {
	dev, ino uint64
	linked   bool
}

// listXattrs returns the xattrs of p, sorted, without ignoredXattrs.
func listXattrs(p string) ([]xattr, error) {
	m, err := layer.ReadXattrs(p, func(name string) bool { return !ignoredXattrs[name] })
	if err != nil {
		return nil, err
	}
	var out []xattr
	for name, val := range m {
		out = append(out, xattr{name, val})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// buildManifest describes the freshly applied diff with the digests Apply
// reported while it wrote the files.
func buildManifest(ctx context.Context, diff string, digests map[inodeID]layer.FileDigest) ([]mentry, error) {
	entries, ids, err := scanTree(ctx, diff)
	if err != nil {
		return nil, err
	}
	for i := range entries {
		e := &entries[i]
		if e.Type != mFile {
			continue
		}
		d, ok := digests[inodeID{ids[i].dev, ids[i].ino, false}]
		if !ok || d.Size != e.Size {
			// Every regular file of an applied layer was written by
			// Apply, which reported it; anything else is a bug.
			return nil, fmt.Errorf("manifest: no digest for %s as applied", e.Path)
		}
		e.Digest = formatDigest(d.Algo, d.Sum)
	}
	return entries, nil
}

// fileDigest reads the file at p and returns its digest by algo, and
// whether every byte was zero.
func fileDigest(ctx context.Context, p string, algo layer.DigestAlgo) (string, bool, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOATIME, 0)
	if errors.Is(err, unix.EPERM) {
		fd, err = unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return "", false, fmt.Errorf("open %s: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", false, fmt.Errorf("stat %s: %w", p, err)
	}
	buf := make([]byte, 1<<20)
	zeros := true
	note := func(b []byte) {
		if zeros && !allZero(b) {
			zeros = false
		}
	}
	switch algo {
	case layer.DigestSHA256:
		h := sha256.New()
		for {
			if err := ctx.Err(); err != nil {
				return "", false, err
			}
			n, err := f.Read(buf)
			h.Write(buf[:n])
			note(buf[:n])
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return "", false, fmt.Errorf("read %s: %w", p, err)
			}
		}
		var sum [sha256.Size]byte
		h.Sum(sum[:0])
		return formatDigest(algo, sum), zeros, nil
	case layer.DigestSparseSHA256:
		h := layer.NewSparseHash()
		var off int64
		for off < st.Size {
			if err := ctx.Err(); err != nil {
				return "", false, err
			}
			data, err := unix.Seek(fd, off, unix.SEEK_DATA)
			if errors.Is(err, unix.ENXIO) {
				break
			}
			if err != nil {
				return "", false, fmt.Errorf("seek data in %s: %w", p, err)
			}
			hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
			if err != nil {
				return "", false, fmt.Errorf("seek hole in %s: %w", p, err)
			}
			// Whole blocks, from the block the extent starts in.
			start := max(off, data/layer.SparseBlock*layer.SparseBlock)
			for start < hole {
				n, err := f.ReadAt(buf[:min(int64(len(buf)), hole-start)], start)
				h.WriteAt(buf[:n], start)
				note(buf[:n])
				start += int64(n)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return "", false, fmt.Errorf("read %s: %w", p, err)
				}
			}
			off = max(hole, start)
		}
		return formatDigest(algo, h.Sum(st.Size)), zeros, nil
	}
	return "", false, fmt.Errorf("digest %s: unknown algorithm %q", p, algo)
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
