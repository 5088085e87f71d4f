package graph

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// stateFile keeps the state as a log of snapshots: every change appends
// the whole new state, framed by a trailer, and the last complete snapshot
// is the state. When the log has grown to several snapshots it is
// compacted: a new file with the last snapshot alone is written beside it
// and renamed over it.
//
// Appending rather than replacing the file on every change matters on
// ext4, whose auto_da_alloc flushes the new file's data at once when a
// rename replaces an existing file; the next sync (every overlay unmount
// syncs the upper filesystem) then waits for that write. An append is
// written back with everything else.
//
// A crash can cut the last snapshot short, or leave zeros where its data
// never reached the disk; its trailer then does not check out, the log is
// read from the start up to the last snapshot that does, and the next
// change compacts the log instead of appending after the damage. With
// Sync, every append is fdatasync'd and a compaction is fsync'd with its
// directory, so a change that returned survives power loss.
type stateFile struct {
	path string
	sync bool
	log  *slog.Logger // for the leftovers of a failed rewrite
	// file is the open state file, kept between calls (read and
	// appended to); a compaction by any process replaces the file at
	// path, which a different inode number there reveals. While file
	// is open its inode cannot be freed, so its number cannot come back
	// on another file.
	file *os.File

	// The last state read or written, valid while the file is the same
	// inode of the same size ending in the same trailer. A replaced file
	// that happened to reuse the inode number and size would have to end
	// in a snapshot of the same length and CRC as well.
	cached  *state
	ino     uint64 // of file
	size    int64
	trailer [trailerSize]byte
	// compact makes the next store rewrite the file: it is in the
	// original single-JSON format, or ends in a damaged snapshot.
	compact bool
}

// stateName is the state file in the home. legacyStateName is its name
// from when it held one JSON document; Open renames such a file.
const (
	stateName       = "state.log"
	legacyStateName = "state.json"
)

const (
	trailerSize  = 16
	trailerMagic = "OVLS"
	// compactAt is the log size past which a change compacts it, or
	// compactSnapshots times the snapshot size, whichever is larger.
	compactAt        = 256 << 10
	compactSnapshots = 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// trailer follows every snapshot: magic, payload length, CRC-32C of the
// payload, and the format version.
func makeTrailer(payload []byte) [trailerSize]byte {
	var t [trailerSize]byte
	copy(t[0:4], trailerMagic)
	binary.LittleEndian.PutUint32(t[4:8], uint32(len(payload)))
	binary.LittleEndian.PutUint32(t[8:12], crc32.Checksum(payload, castagnoli))
	binary.LittleEndian.PutUint32(t[12:16], 1)
	return t
}

// parseTrailer returns the payload length a trailer announces.
func parseTrailer(t []byte) (int64, bool) {
	if len(t) != trailerSize || string(t[0:4]) != trailerMagic || binary.LittleEndian.Uint32(t[12:16]) != 1 {
		return 0, false
	}
	return int64(binary.LittleEndian.Uint32(t[4:8])), true
}

func checkPayload(payload []byte, t []byte) bool {
	return binary.LittleEndian.Uint32(t[8:12]) == crc32.Checksum(payload, castagnoli)
}

// open makes f.file the file now at path and returns its size.
func (f *stateFile) open() (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat(f.path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, fmt.Errorf("no store state at %s: %w", f.path, ErrNoStore)
		}
		return 0, fmt.Errorf("read state: %w", err)
	}
	if f.file != nil && st.Ino == f.ino {
		return st.Size, nil
	}
	f.close()
	file, err := os.OpenFile(f.path, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		return 0, fmt.Errorf("read state: %w", err)
	}
	if err := unix.Fstat(int(file.Fd()), &st); err != nil {
		file.Close()
		return 0, fmt.Errorf("read state: %w", err)
	}
	f.file, f.ino, f.cached = file, st.Ino, nil
	return st.Size, nil
}

// close releases the file; the next load opens it again.
func (f *stateFile) close() {
	if f.file != nil {
		f.file.Close()
	}
	f.file, f.cached = nil, nil
}

// tail reads the trailer at the end of a file of size bytes.
func (f *stateFile) tail(size int64) ([trailerSize]byte, error) {
	var t [trailerSize]byte
	if size < trailerSize {
		return t, nil
	}
	if _, err := f.file.ReadAt(t[:], size-trailerSize); err != nil {
		return t, fmt.Errorf("read state: %w", err)
	}
	return t, nil
}

// peek returns the state last read or written if the file provably has
// not changed since, without the store lock (a change in progress shows
// as another size or trailer), or nil. The caller holds the in-process
// mutex, which guards the cached state.
func (f *stateFile) peek() *state {
	if f.cached == nil || f.file == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Stat(f.path, &st); err != nil || st.Ino != f.ino || st.Size != f.size {
		return nil
	}
	if t, err := f.tail(st.Size); err != nil || t != f.trailer {
		return nil
	}
	return f.cached
}

// load returns the current state; the caller must hold the store lock.
func (f *stateFile) load() (*state, error) {
	size, err := f.open()
	if err != nil {
		return nil, err
	}
	t, err := f.tail(size)
	if err != nil {
		return nil, err
	}
	if f.cached != nil && size == f.size && t == f.trailer {
		return f.cached, nil
	}
	if n, ok := parseTrailer(t[:]); ok && n <= size-trailerSize {
		payload := make([]byte, n)
		if _, err := f.file.ReadAt(payload, size-trailerSize-n); err != nil {
			return nil, fmt.Errorf("read state: %w", err)
		}
		if checkPayload(payload, t[:]) {
			s, err := decodeState(payload)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f.path, err)
			}
			f.remember(s, size, t, false)
			return s, nil
		}
	}
	// No intact snapshot at the end: the file is in the single-JSON
	// format, or a crash damaged its end.
	all := make([]byte, size)
	if _, err := f.file.ReadAt(all, 0); err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	payload, err := lastSnapshot(all)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.path, err)
	}
	s, err := decodeState(payload)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.path, err)
	}
	f.remember(s, size, t, true)
	return s, nil
}

// lastSnapshot finds the state in a whole file: the last intact snapshot
// of a log read from the start, or the file itself in the single-JSON
// format.
func lastSnapshot(b []byte) ([]byte, error) {
	if len(bytes.TrimSpace(b)) > 0 && bytes.TrimSpace(b)[0] == '{' && json.Valid(b) {
		return b, nil
	}
	var last []byte
	for off := 0; ; {
		// A snapshot is a JSON object; its end is found by decoding.
		dec := json.NewDecoder(bytes.NewReader(b[off:]))
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			break
		}
		end := off + int(dec.InputOffset())
		if end+trailerSize > len(b) {
			break
		}
		payload, t := b[off:end], b[end:end+trailerSize]
		if n, ok := parseTrailer(t); !ok || n != int64(len(payload)) || !checkPayload(payload, t) {
			break
		}
		last, off = payload, end+trailerSize
	}
	if last == nil {
		return nil, errors.New("no intact state snapshot")
	}
	return last, nil
}

func (f *stateFile) remember(s *state, size int64, t [trailerSize]byte, compact bool) {
	f.cached, f.size, f.trailer, f.compact = s, size, t, compact
}

// invalidate drops the cache after a failed update, whose in-memory
// changes must not survive.
func (f *stateFile) invalidate() { f.cached = nil }

// store records st; the caller must hold the store lock and have loaded
// the state in this lock hold.
func (f *stateFile) store(st *state) error {
	payload, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	t := makeTrailer(payload)
	rec := append(payload, t[:]...)
	limit := max(int64(compactAt), compactSnapshots*int64(len(rec)))
	if f.cached == nil || f.file == nil || f.compact || f.size+int64(len(rec)) > limit {
		return f.rewrite(st, rec, t)
	}
	// The file is the one load read in this lock hold.
	if _, err := f.file.Write(rec); err != nil {
		// A short append leaves a damaged end, which the next load
		// reads past and the next store compacts away.
		return fmt.Errorf("write state: %w", err)
	}
	if f.sync {
		if err := unix.Fdatasync(int(f.file.Fd())); err != nil {
			return fmt.Errorf("fsync state: %w", err)
		}
	}
	f.remember(st, f.size+int64(len(rec)), t, false)
	return nil
}

// rewrite replaces the file by one holding rec alone: a new file is
// written beside it and renamed over it, so a crash leaves the old file or
// the new one.
func (f *stateFile) rewrite(st *state, rec []byte, t [trailerSize]byte) error {
	dir := filepath.Dir(f.path)
	tmp, err := os.CreateTemp(dir, ".state-*")
	if err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			logCleanup(f.log, "remove unfinished state file", os.Remove(tmp.Name()))
		}
	}()
	if _, err := tmp.Write(rec); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	if f.sync {
		if err := tmp.Sync(); err != nil {
			return fmt.Errorf("fsync state: %w", err)
		}
	}
	if err := tmp.Chmod(0o600); err != nil {
		return fmt.Errorf("chmod state: %w", err)
	}
	var fst unix.Stat_t
	if err := unix.Fstat(int(tmp.Fd()), &fst); err != nil {
		return fmt.Errorf("stat state: %w", err)
	}
	// The new file stays open for the appends that follow, which must
	// land at its end whatever other processes appended meanwhile.
	if _, err := unix.FcntlInt(tmp.Fd(), unix.F_SETFL, unix.O_APPEND); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.path); err != nil {
		return fmt.Errorf("replace state: %w", err)
	}
	ok = true
	f.close()
	f.file, f.ino = tmp, fst.Ino
	f.remember(st, int64(len(rec)), t, false)
	if f.sync {
		if err := syncDir(dir); err != nil {
			return err
		}
	}
	return nil
}

// migrateStateName renames a store's state file from its old name to
// stateName, once: the content is read as before (see lastSnapshot). A
// rename that finds the old file gone or the new one there lost a race
// with another Open doing the same and is done. With sync the rename is
// made durable before the store is used.
func migrateStateName(home string, sync bool) error {
	if _, err := os.Lstat(filepath.Join(home, stateName)); err == nil {
		return nil
	}
	from, to := filepath.Join(home, legacyStateName), filepath.Join(home, stateName)
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) {
		// A filesystem without RENAME_NOREPLACE: the check above
		// stands in for it.
		err = os.Rename(from, to)
	}
	switch {
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EEXIST):
		return nil
	case err != nil:
		return fmt.Errorf("rename %s to %s: %w", legacyStateName, stateName, err)
	case sync:
		return syncDir(home)
	}
	return nil
}
