package layer

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

type inodeKey struct{ dev, ino uint64 }

// checkExportName refuses a path with a component starting with ".wh.":
// in a tar such a name is a whiteout or an opaque marker, so the entry
// would apply as a deletion instead of itself. Apply never creates one;
// a container can.
func checkExportName(rel string) error {
	for _, c := range strings.Split(rel, "/") {
		if strings.HasPrefix(c, whiteoutPrefix) {
			return fmt.Errorf("%s: %q is a whiteout name in a tar layer and cannot be exported", rel, c)
		}
	}
	return nil
}

// tarWriter emits entries from disk: metadata from one path, content
// from another (they differ for metacopy files), hard links once.
type tarWriter struct {
	ctx   context.Context
	tw    *tar.Writer
	links map[inodeKey]string
	buf   []byte // see buffer
}

func newTarWriter(ctx context.Context, w io.Writer) *tarWriter {
	return &tarWriter{ctx: ctx, tw: tar.NewWriter(w), links: make(map[inodeKey]string)}
}

// minCopyBuf is the first copy buffer an export allocates: what
// go-archive's pooled buffers hold, and a small object for Go's allocator.
const minCopyBuf = 32 << 10

// buffer returns the copy buffer for a file of size bytes. It grows, by
// powers of two, to the largest file exported so far, up to copyBufSize.
// A full-size buffer for every export cost more than exporting a small
// layer: the allocator clears a fresh 1 MiB and the collector hands it
// back, several times the work of a diff of three small files.
func (t *tarWriter) buffer(size int64) []byte {
	if int64(len(t.buf)) >= size || len(t.buf) >= copyBufSize {
		return t.buf
	}
	n := minCopyBuf
	for int64(n) < size && n < copyBufSize {
		n *= 2
	}
	t.buf = make([]byte, n)
	return t.buf
}

func mtimeOf(st *unix.Stat_t) time.Time { return time.Unix(st.Mtim.Sec, st.Mtim.Nsec) }

// entry writes name (relative, no leading slash) from the node's metadata.
// Sockets cannot be stored in a tar and are left out.
func (t *tarWriter) entry(name string, st *unix.Stat_t, metaPath, dataPath string, bare bool) error {
	if err := t.ctx.Err(); err != nil {
		return err
	}
	if err := checkExportName(name); err != nil {
		return err
	}
	hdr := &tar.Header{
		Name:    name,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: mtimeOf(st),
		// PAX keeps sub-second mtimes, so that a diff applied elsewhere
		// compares equal to its source.
		Format: tar.FormatPAX,
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		key := inodeKey{uint64(st.Dev), st.Ino}
		if first, ok := t.links[key]; ok && st.Nlink > 1 {
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
		} else {
			hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
			if st.Nlink > 1 {
				t.links[key] = name
			}
		}
	case unix.S_IFDIR:
		hdr.Typeflag = tar.TypeDir
		hdr.Name = name + "/"
	case unix.S_IFLNK:
		target, err := os.Readlink(metaPath)
		if err != nil {
			return fmt.Errorf("readlink %s: %w", metaPath, err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
	case unix.S_IFCHR, unix.S_IFBLK:
		hdr.Typeflag = tar.TypeChar
		if st.Mode&unix.S_IFMT == unix.S_IFBLK {
			hdr.Typeflag = tar.TypeBlock
		}
		hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	default:
		return nil
	}
	var xattrs map[string][]byte
	if !bare {
		var err error
		if xattrs, err = listXattrs(metaPath); err != nil {
			return err
		}
	}
	for _, k := range sortedKeys(xattrs) {
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = make(map[string]string)
		}
		hdr.PAXRecords[paxXattrPrefix+k] = string(xattrs[k])
	}
	if err := t.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write header %s: %w", name, err)
	}
	if hdr.Typeflag != tar.TypeReg || hdr.Size == 0 {
		return nil
	}
	if dataPath == "" {
		return fmt.Errorf("%s: metacopy file without its lower data (export needs the lowers)", metaPath)
	}
	return t.data(dataPath, hdr.Size)
}

// data writes the content of a regular file entry of size bytes from
// dataPath.
func (t *tarWriter) data(dataPath string, size int64) error {
	fd, err := openNoEINTR(dataPath, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open %s: %w", dataPath, err)
	}
	defer unix.Close(fd)
	n, err := io.CopyBuffer(t.tw, io.LimitReader(fdReader(fd), size), t.buffer(size))
	if err != nil {
		return fmt.Errorf("copy %s: %w", dataPath, err)
	}
	if n != size {
		return fmt.Errorf("%s shrank while exported (%d of %d bytes)", dataPath, n, size)
	}
	return nil
}

// marker writes an empty regular file entry: the form of .wh. whiteouts
// and opaque markers.
func (t *tarWriter) marker(name string, mode int64, st *unix.Stat_t) error {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Format: tar.FormatPAX, ModTime: time.Unix(0, 0)}
	if st != nil {
		hdr.Uid, hdr.Gid, hdr.ModTime = int(st.Uid), int(st.Gid), mtimeOf(st)
	}
	if err := t.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write header %s: %w", name, err)
	}
	return nil
}

// exporter writes one overlay diff directory.
type exporter struct {
	*tarWriter
	newV, oldV  *fsView
	lowersKnown bool
}

func export(ctx context.Context, w io.Writer, diff string, opts ExportOptions) error {
	prefix, err := opts.Whiteouts.xattrPrefix()
	if err != nil {
		return err
	}
	e := &exporter{
		tarWriter:   newTarWriter(ctx, w),
		newV:        &fsView{layers: append([]string{diff}, opts.Lowers...), prefix: prefix},
		oldV:        &fsView{layers: opts.Lowers, prefix: prefix},
		lowersKnown: opts.Lowers != nil,
	}
	if err := e.run(); err != nil {
		return fmt.Errorf("layer: export %s: %w", diff, err)
	}
	if err := e.tw.Close(); err != nil {
		return fmt.Errorf("layer: export %s: %w", diff, err)
	}
	return nil
}

func (e *exporter) run() error {
	o, n, err := roots(e.oldV, e.newV)
	if err != nil {
		return err
	}
	opaque, err := e.newV.isOpaque(n.path)
	if err != nil {
		return err
	}
	if opaque && (!e.lowersKnown || len(e.oldV.layers) > 0) {
		if err := e.marker(whiteoutOpaque, int64(n.st.Mode&0o7777), &n.st); err != nil {
			return err
		}
	}
	return e.dir("", n, o, false)
}

// needsMarker reports whether an opaque (or redirected) directory must
// say so in the tar: only when something below could show through. With
// unknown lowers it always must.
func (e *exporter) needsMarker(o node, name string) (bool, error) {
	if !e.lowersKnown {
		return true, nil
	}
	if !o.isDir() {
		return false, nil
	}
	oc, err := e.oldV.lookup(o, name)
	if err != nil {
		return false, err
	}
	return oc.isDir(), nil
}

// dir writes the children of the directory rel. Outside of full mode it
// lists only the diff's own directory; in full mode (below a redirected
// directory, whose lower content is not at its own path in the lowers) it
// writes the whole merged content.
func (e *exporter) dir(rel string, n, o node, full bool) error {
	var names []string
	var err error
	if full {
		names, err = e.newV.names(n)
	} else {
		names, err = e.newV.names(node{stack: n.stack[:1]})
	}
	if err != nil {
		return err
	}
	diff := e.newV.layers[0]
	var st unix.Stat_t
	for _, name := range names {
		p := path.Join(rel, name)
		fp, bare := "", false
		if !full {
			fp = filepath.Join(diff, p)
			if err := unix.Lstat(fp, &st); err != nil {
				return fmt.Errorf("lstat %s: %w", fp, err)
			}
			// Most entries of a diff have no xattrs: one listxattr
			// then stands for the reads of the overlay's (whiteout,
			// opaque, redirect, metacopy) and of those the tar keeps.
			bare = hasNoXattrs(fp)
			wh := false
			if !bare || st.Mode&unix.S_IFMT == unix.S_IFCHR {
				var err error
				if wh, err = e.newV.isWhiteout(fp, &st); err != nil {
					return err
				}
			}
			if wh {
				if err := checkExportName(p); err != nil {
					return err
				}
				if err := e.marker(path.Join(rel, whiteoutPrefix+name), 0o600, &st); err != nil {
					return err
				}
				continue
			}
		}
		// The lookup starts with the same lstat of fp, made just above.
		var nc node
		if fp != "" {
			nc, err = e.newV.lookupKnown(n, name, fp, &st, bare)
		} else {
			nc, err = e.newV.lookup(n, name)
		}
		if err != nil {
			return err
		}
		if !nc.exists {
			continue
		}
		if err := e.entry(p, &nc.st, nc.path, nc.data, bare && nc.path == fp); err != nil {
			return err
		}
		if !nc.isDir() {
			continue
		}
		childFull := full
		if !full && (nc.opaque || nc.redirected) {
			need, err := e.needsMarker(o, name)
			if err != nil {
				return err
			}
			if need {
				if err := e.marker(path.Join(p, whiteoutOpaque), int64(nc.st.Mode&0o7777), &nc.st); err != nil {
					return err
				}
			}
			if nc.redirected {
				if !e.lowersKnown {
					return fmt.Errorf("%s was renamed with redirect_dir; export needs the lowers", nc.path)
				}
				childFull = true
			}
		}
		var oc node
		if o.isDir() && !childFull {
			if oc, err = e.oldV.lookup(o, name); err != nil {
				return err
			}
		}
		if err := e.dir(p, nc, oc, childFull); err != nil {
			return err
		}
	}
	return nil
}

func exportChanges(ctx context.Context, w io.Writer, newRoot string, changes []Change) error {
	sorted := append([]Change(nil), changes...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	t := newTarWriter(ctx, w)
	for _, c := range sorted {
		rel, err := cleanEntryName(strings.TrimPrefix(c.Path, "/"))
		if err != nil || rel == "" {
			return fmt.Errorf("layer: export change %q: invalid path", c.Path)
		}
		if err := checkExportName(rel); err != nil {
			return fmt.Errorf("layer: export change %q: %w", c.Path, err)
		}
		switch c.Kind {
		case ChangeDelete:
			dir, base := splitRel(rel)
			if err := t.marker(path.Join(dir, whiteoutPrefix+base), 0o600, nil); err != nil {
				return fmt.Errorf("layer: export changes: %w", err)
			}
		case ChangeAdd, ChangeModify:
			full := filepath.Join(newRoot, rel)
			var st unix.Stat_t
			if err := unix.Lstat(full, &st); err != nil {
				return fmt.Errorf("layer: export change %s: %w", c.Path, err)
			}
			if err := t.entry(rel, &st, full, full, false); err != nil {
				return fmt.Errorf("layer: export changes: %w", err)
			}
		default:
			return fmt.Errorf("layer: export change %q: unknown kind %d", c.Path, int(c.Kind))
		}
	}
	if err := t.tw.Close(); err != nil {
		return fmt.Errorf("layer: export changes: %w", err)
	}
	return nil
}

func size(diff string) (int64, error) {
	seen := make(map[inodeKey]bool)
	var total int64
	err := filepath.WalkDir(diff, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil
			}
			return fmt.Errorf("lstat %s: %w", p, err)
		}
		if st.Nlink > 1 {
			key := inodeKey{uint64(st.Dev), st.Ino}
			if seen[key] {
				return nil
			}
			seen[key] = true
		}
		total += st.Size
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("layer: size of %s: %w", diff, err)
	}
	return total, nil
}
