// Package logwrites reads the log of the device-mapper "log-writes" target
// and replays it onto a device.
//
// The target passes every write to its data device and also records it, in
// the order the writes completed, on a log device: flushes, FUA writes and
// discards are recorded with their flags, and userspace can insert named
// marks ("dmsetup message DEV 0 mark NAME"). Replaying the first N entries
// of the log onto a copy of the data device as it was when logging began
// rebuilds the device as it could have been found after a power cut at
// that moment. Replaying to each flush, FUA write and mark, and to points
// between them, is how a checker sees every state a filesystem has to
// recover from.
//
// The format (Documentation/admin-guide/device-mapper/log-writes.rst in the
// kernel tree; all integers little-endian):
//
//	offset 0:            super: magic u64, version u64, nr_entries u64,
//	                     sectorsize u32, padded to one sector
//	then nr_entries of:  header: sector u64, nr_sectors u64, flags u64,
//	                     data_len u64, a mark's name (data_len bytes),
//	                     padded to one sector;
//	                     the written data, nr_sectors sectors (none for a
//	                     discard)
//
// A sector here is the data device's logical block size ("sectorsize"),
// and entry sectors are counted in it, not in 512-byte units.
package logwrites

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Magic is the first field of the super block.
const Magic = 0x6a736677736872

// Version is the only format version there is.
const Version = 1

// Entry flags.
const (
	FlagFlush    = 1 << 0 // a flush (REQ_PREFLUSH): what completed before it is durable
	FlagFUA      = 1 << 1 // a write that was durable when it completed
	FlagDiscard  = 1 << 2 // a discard: no data, the range reads as zeros on replay
	FlagMark     = 1 << 3 // a userspace mark, its name in the header
	FlagMetadata = 1 << 4 // the filesystem tagged the write as metadata (REQ_META)
	knownFlags   = FlagFlush | FlagFUA | FlagDiscard | FlagMark | FlagMetadata
)

const (
	superLen  = 8 + 8 + 8 + 4
	headerLen = 8 * 4
	// The kernel takes a device's logical block size; anything outside
	// this range is not a log.
	minSectorSize = 512
	maxSectorSize = 64 << 10
)

// ErrFormat is wrapped by every error about the content of a log.
var ErrFormat = errors.New("not a valid dm-log-writes log")

// Super is the log's super block.
type Super struct {
	Version    uint64
	Entries    uint64 // entries the log holds
	SectorSize uint32 // bytes per sector, for both devices
}

// Entry is one logged write, flush, discard or mark.
type Entry struct {
	Index     int
	Sector    uint64 // first sector written, in SectorSize units
	NrSectors uint64
	Flags     uint64
	Mark      string // the mark's name, for FlagMark
	// DataOffset is where the written data starts in the log, in bytes.
	DataOffset int64
}

// IsMark, IsFlush, IsFUA and IsDiscard report the entry's flags.
func (e Entry) IsMark() bool    { return e.Flags&FlagMark != 0 }
func (e Entry) IsFlush() bool   { return e.Flags&FlagFlush != 0 }
func (e Entry) IsFUA() bool     { return e.Flags&FlagFUA != 0 }
func (e Entry) IsDiscard() bool { return e.Flags&FlagDiscard != 0 }

// String describes the entry for test output.
func (e Entry) String() string {
	var f []string
	for _, n := range []struct {
		bit  uint64
		name string
	}{{FlagFlush, "flush"}, {FlagFUA, "fua"}, {FlagDiscard, "discard"}, {FlagMark, "mark"}, {FlagMetadata, "meta"}} {
		if e.Flags&n.bit != 0 {
			f = append(f, n.name)
		}
	}
	s := fmt.Sprintf("#%d sector %d+%d [%s]", e.Index, e.Sector, e.NrSectors, strings.Join(f, ","))
	if e.IsMark() {
		s += fmt.Sprintf(" %q", e.Mark)
	}
	return s
}

// Log is a decoded log. Its entries refer to the data in the reader it was
// decoded from, which Replay reads.
type Log struct {
	Super
	Entries []Entry
	r       io.ReaderAt
}

// Decode reads the super block and every entry header of the log in r, of
// size bytes (the log device's or file's size). The data is not read; it
// must stay readable through r for Replay.
func Decode(r io.ReaderAt, size int64) (*Log, error) {
	s, err := decodeSuper(r, size)
	if err != nil {
		return nil, err
	}
	ss := int64(s.SectorSize)
	l := &Log{Super: s, Entries: make([]Entry, 0, s.Entries), r: r}
	hdr := make([]byte, ss)
	off := ss
	for i := 0; uint64(i) < s.Entries; i++ {
		if off > size-ss {
			return nil, fmt.Errorf("%w: entry %d at byte %d is past the end (%d bytes)", ErrFormat, i, off, size)
		}
		if _, err := r.ReadAt(hdr, off); err != nil {
			return nil, fmt.Errorf("read header of entry %d at byte %d: %w", i, off, err)
		}
		e, err := decodeEntry(i, hdr, off+ss, size)
		if err != nil {
			return nil, err
		}
		off = e.DataOffset + e.dataBytes(ss)
		l.Entries = append(l.Entries, e)
	}
	return l, nil
}

// decodeSuper reads and checks the super block of a log of size bytes.
func decodeSuper(r io.ReaderAt, size int64) (Super, error) {
	var sb [superLen]byte
	if size < minSectorSize {
		return Super{}, fmt.Errorf("%w: %d bytes is smaller than a super block sector", ErrFormat, size)
	}
	if _, err := r.ReadAt(sb[:], 0); err != nil {
		return Super{}, fmt.Errorf("read super block: %w", err)
	}
	le := binary.LittleEndian
	if m := le.Uint64(sb[0:]); m != Magic {
		return Super{}, fmt.Errorf("%w: magic %#x, want %#x", ErrFormat, m, uint64(Magic))
	}
	s := Super{Version: le.Uint64(sb[8:]), Entries: le.Uint64(sb[16:]), SectorSize: le.Uint32(sb[24:])}
	if s.Version != Version {
		return Super{}, fmt.Errorf("%w: version %d, want %d", ErrFormat, s.Version, Version)
	}
	ss := int64(s.SectorSize)
	if ss < minSectorSize || ss > maxSectorSize || ss&(ss-1) != 0 {
		return Super{}, fmt.Errorf("%w: sector size %d is not a power of two in [%d, %d]",
			ErrFormat, ss, minSectorSize, maxSectorSize)
	}
	// The super block fills a whole sector; a log shorter than one
	// sector would also make the count below wrap.
	if size < ss {
		return Super{}, fmt.Errorf("%w: %d bytes is smaller than a %d-byte sector", ErrFormat, size, ss)
	}
	// Every entry takes at least its header sector: a count the size
	// cannot hold is damage, and is refused before anything is allocated
	// for it.
	if max := uint64(size/ss) - 1; s.Entries > max {
		return Super{}, fmt.Errorf("%w: %d entries do not fit in %d bytes of %d-byte sectors",
			ErrFormat, s.Entries, size, ss)
	}
	return s, nil
}

// decodeEntry reads entry i from its header sector hdr; its data starts
// at byte dataOff of a log of size bytes.
func decodeEntry(i int, hdr []byte, dataOff, size int64) (Entry, error) {
	le := binary.LittleEndian
	ss := int64(len(hdr))
	e := Entry{
		Index:      i,
		Sector:     le.Uint64(hdr[0:]),
		NrSectors:  le.Uint64(hdr[8:]),
		Flags:      le.Uint64(hdr[16:]),
		DataOffset: dataOff,
	}
	dataLen := le.Uint64(hdr[24:])
	if e.Flags&^knownFlags != 0 {
		return e, fmt.Errorf("%w: entry %d has unknown flags %#x", ErrFormat, i, e.Flags)
	}
	switch {
	case e.IsMark():
		// A mark's name shares the header sector.
		if dataLen > uint64(ss-headerLen) {
			return e, fmt.Errorf("%w: mark of entry %d is %d bytes, more than a sector holds",
				ErrFormat, i, dataLen)
		}
		if e.NrSectors != 0 {
			return e, fmt.Errorf("%w: mark entry %d claims %d sectors of data", ErrFormat, i, e.NrSectors)
		}
		e.Mark = string(hdr[headerLen : headerLen+dataLen])
	case dataLen != 0:
		// Only marks carry data of their own in this format version;
		// anything else would be misread.
		return e, fmt.Errorf("%w: entry %d has %d bytes of private data but is no mark", ErrFormat, i, dataLen)
	case e.IsDiscard():
		// A discard records its range but no data.
	default:
		n, ok := sectorBytes(e.NrSectors, ss)
		if !ok || n > size-dataOff {
			return e, fmt.Errorf("%w: entry %d's %d sectors of data at byte %d run past the end (%d bytes)",
				ErrFormat, i, e.NrSectors, dataOff, size)
		}
	}
	if _, ok := sectorBytes(e.Sector+e.NrSectors, ss); !ok || e.Sector+e.NrSectors < e.Sector {
		return e, fmt.Errorf("%w: entry %d's range %d+%d overflows", ErrFormat, i, e.Sector, e.NrSectors)
	}
	return e, nil
}

// dataBytes is how much of the log e's data takes after its header: the
// sectors of a write, none for a mark or a discard.
func (e *Entry) dataBytes(ss int64) int64 {
	if e.IsMark() || e.IsDiscard() {
		return 0
	}
	n, _ := sectorBytes(e.NrSectors, ss)
	return n
}

// sectorBytes returns n sectors of size ss in bytes, and false when that
// does not fit an int64.
func sectorBytes(n uint64, ss int64) (int64, bool) {
	if n > uint64(1<<62)/uint64(ss) {
		return 0, false
	}
	return int64(n) * ss, true
}

// Point is a moment of the log to replay to: the state after the first
// Applied entries.
type Point struct {
	Applied int
	// Why is "flush", "fua", "flush+fua", "mark" or "between".
	Why string
	// Mark is the name of the last mark at or before the point, "" when
	// there is none.
	Mark string
}

// Points lists the replay points of the log: after every flush, FUA write
// and mark, and, when between > 0, up to between evenly spaced points
// inside each run of plain writes between two of them (a crash can land
// there too, and a filesystem must recover from that as well).
func (l *Log) Points(between int) []Point {
	var pts []Point
	mark := ""
	last := 0 // Applied of the previous listed point
	for i, e := range l.Entries {
		var why string
		switch {
		case e.IsMark():
			mark = e.Mark
			why = "mark"
		case e.IsFlush() && e.IsFUA():
			why = "flush+fua"
		case e.IsFlush():
			why = "flush"
		case e.IsFUA():
			why = "fua"
		default:
			continue
		}
		pts = appendBetween(pts, last, i+1, between, mark)
		pts = append(pts, Point{Applied: i + 1, Why: why, Mark: mark})
		last = i + 1
	}
	return appendBetween(pts, last, len(l.Entries)+1, between, mark)
}

// appendBetween adds up to n points strictly between lo and hi.
func appendBetween(pts []Point, lo, hi, n int, mark string) []Point {
	gap := hi - lo - 1
	if n <= 0 || gap <= 0 {
		return pts
	}
	if n > gap {
		n = gap
	}
	for k := 1; k <= n; k++ {
		pts = append(pts, Point{Applied: lo + k*(gap+1)/(n+1), Why: "between", Mark: mark})
	}
	return pts
}

// Sample returns at most max of pts, in order: every mark, then as many of
// the others as fit, evenly spread. A long log has thousands of flushes;
// replaying to each would take hours in an emulated guest.
func Sample(pts []Point, max int) []Point {
	if len(pts) <= max {
		return pts
	}
	var marks, rest []int
	for i, p := range pts {
		if p.Why == "mark" {
			marks = append(marks, i)
		} else {
			rest = append(rest, i)
		}
	}
	keep := map[int]bool{}
	for _, i := range marks {
		keep[i] = true
	}
	if room := max - len(marks); room > 0 {
		for k := 0; k < room; k++ {
			keep[rest[k*len(rest)/room]] = true
		}
	}
	var out []Point
	for i, p := range pts {
		if keep[i] {
			out = append(out, p)
		}
	}
	return out
}

// Discarder is a replay target that can drop a range so that it reads as
// zeros without writing them, as fallocate(PUNCH_HOLE) does for a file.
// A discard of a whole device would otherwise write gigabytes of zeros.
type Discarder interface {
	Discard(off, n int64) error
}

// Replay writes entries [from, to) of the log onto w, which must hold the
// data device as it was after the first from entries (the state when
// logging began, for from 0). Discarded ranges become zeros (through
// Discarder when w has it): what a discard leaves behind is undefined, and
// zeros are the worst a filesystem may find there.
func (l *Log) Replay(w io.WriterAt, from, to int) error {
	if from < 0 || to > len(l.Entries) || from > to {
		return fmt.Errorf("replay entries [%d, %d) of a log of %d", from, to, len(l.Entries))
	}
	ss := int64(l.SectorSize)
	buf := make([]byte, 1<<20)
	var zeros []byte
	for _, e := range l.Entries[from:to] {
		if e.IsMark() || e.NrSectors == 0 {
			continue
		}
		dst, _ := sectorBytes(e.Sector, ss)
		n, _ := sectorBytes(e.NrSectors, ss)
		if e.IsDiscard() {
			if d, ok := w.(Discarder); ok {
				if err := d.Discard(dst, n); err != nil {
					return fmt.Errorf("replay %v: discard %d bytes at %d: %w", e, n, dst, err)
				}
				continue
			}
			if zeros == nil {
				zeros = make([]byte, len(buf))
			}
			if err := fill(w, dst, n, zeros); err != nil {
				return fmt.Errorf("replay %v: %w", e, err)
			}
			continue
		}
		if err := copyAt(w, dst, l.r, e.DataOffset, n, buf); err != nil {
			return fmt.Errorf("replay %v: %w", e, err)
		}
	}
	return nil
}

func fill(w io.WriterAt, off, n int64, zeros []byte) error {
	for n > 0 {
		c := min(n, int64(len(zeros)))
		if _, err := w.WriteAt(zeros[:c], off); err != nil {
			return fmt.Errorf("zero %d bytes at %d: %w", c, off, err)
		}
		off += c
		n -= c
	}
	return nil
}

func copyAt(w io.WriterAt, dst int64, r io.ReaderAt, src, n int64, buf []byte) error {
	for n > 0 {
		c := min(n, int64(len(buf)))
		if _, err := r.ReadAt(buf[:c], src); err != nil {
			return fmt.Errorf("read %d bytes of log at %d: %w", c, src, err)
		}
		if _, err := w.WriteAt(buf[:c], dst); err != nil {
			return fmt.Errorf("write %d bytes at %d: %w", c, dst, err)
		}
		src += c
		dst += c
		n -= c
	}
	return nil
}
