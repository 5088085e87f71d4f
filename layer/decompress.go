package layer

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

var (
	magicGzip  = []byte{0x1f, 0x8b}
	magicZstd  = []byte{0x28, 0xb5, 0x2f, 0xfd}
	magicBzip2 = []byte("BZh")
	magicXz    = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
)

// decompress detects the compression of r from its first bytes and returns
// the plain tar stream. The returned close releases decoder resources; it
// does not close r. maxWindow (0 for the decoder's own maximum) bounds the
// window a zstd frame may ask for.
func decompress(r io.Reader, maxWindow int64) (io.Reader, func(), error) {
	head := make([]byte, len(magicXz))
	n, err := io.ReadFull(r, head)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, nil, fmt.Errorf("read layer header: %w", err)
	}
	head = head[:n]
	// The header goes back in front of the stream; a plain tar is then
	// read straight from r, without a copy through a buffer.
	src := io.MultiReader(bytes.NewReader(head), r)
	buffered := func(size int) *bufio.Reader { return bufio.NewReaderSize(src, size) }
	switch {
	case bytes.HasPrefix(head, magicGzip):
		// gzip reads its input byte by byte (io.ByteReader) from the
		// buffer itself.
		zr, err := gzip.NewReader(buffered(256 << 10))
		if err != nil {
			return nil, nil, fmt.Errorf("gzip layer: %w", err)
		}
		// Layers are one gzip member; a second one would be unusual but is
		// what the format allows, so it is read rather than ignored.
		return zr, func() { _ = zr.Close() }, nil
	case bytes.HasPrefix(head, magicZstd):
		// The default concurrency decodes blocks ahead of the tar reader
		// on a machine with spare CPUs and decodes synchronously on one.
		// zstd reads each block whole into a buffer of its own, up to
		// 128 KiB: bufio passes a read at least as large as its buffer,
		// when empty, straight to the source, so a small buffer serves
		// the headers and lets most of each block be copied once, from
		// the source into the decoder, instead of through the buffer.
		br := buffered(16 << 10)
		opts := []zstd.DOption{zstd.WithDecoderLowmem(!roomyHistory(br))}
		if maxWindow > 0 {
			// The frame header's window is checked against this before
			// the decoder allocates it.
			opts = append(opts, zstd.WithDecoderMaxWindow(uint64(maxWindow)))
		}
		zr, err := zstd.NewReader(br, opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("zstd layer: %w", err)
		}
		return &zstdLimited{r: zr, max: maxWindow}, zr.Close, nil
	case bytes.HasPrefix(head, magicBzip2):
		return bzip2.NewReader(buffered(256 << 10)), func() {}, nil
	case bytes.HasPrefix(head, magicXz):
		return nil, nil, errors.New("xz-compressed layers are not supported")
	}
	return src, func() {}, nil
}

// roomyHistoryMax is the largest window for which the zstd decoder keeps a
// history buffer of twice the window (see roomyHistory): zstd's levels up
// to 19 use windows of at most 8 MiB.
const roomyHistoryMax = 32 << 20

// roomyHistory reports, from the header of the stream's first frame,
// whether the decoder should keep a history of twice the window rather
// than its low-memory default of the window plus 1 MiB. Its history holds
// the window and what it decodes after it; when the buffer is full it
// moves the last window to the front. With 1 MiB to spare, a 4 MiB
// window (zstd's fastest level) is moved after every megabyte decoded,
// four bytes copied for each byte of the layer; with a window to spare,
// one. A single-segment frame, decoded in one piece, never moves it, and
// a window above roomyHistoryMax is left to the default. The header is
// read without taking it from br. A later frame with a larger window
// makes the decoder keep twice that window: up to twice
// Limits.MaxDecoderWindow.
func roomyHistory(br *bufio.Reader) bool {
	b, _ := br.Peek(zstd.HeaderMaxSize)
	var h zstd.Header
	if err := h.Decode(b); err != nil {
		return false // the decoder reports what is wrong with the frame
	}
	return !h.SingleSegment && !h.Skippable && h.WindowSize > 0 && h.WindowSize <= roomyHistoryMax
}

// trailerReader remembers the last tar block it passed on so that the end
// of the stream can be told from a truncation: archive/tar reports io.EOF
// both after the end-of-archive marker and when the stream stops exactly
// between two entries.
type trailerReader struct {
	r    io.Reader
	last [512]byte
	n    int64
}

func (t *trailerReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if n > 0 {
		if n >= len(t.last) {
			copy(t.last[:], p[n-len(t.last):n])
		} else {
			copy(t.last[:], t.last[n:])
			copy(t.last[len(t.last)-n:], p[:n])
		}
		t.n += int64(n)
	}
	return n, err
}

// sawEndMarker reports whether the stream ended in a zero block, the start
// of the end-of-archive marker. A stream whose last entry's data ends in 512
// zero bytes and is cut right after it is not told apart; every other cut
// is.
func (t *trailerReader) sawEndMarker() bool {
	if t.n < int64(len(t.last)) {
		return false
	}
	for _, b := range t.last {
		if b != 0 {
			return false
		}
	}
	return true
}

// zstdLimited names the limit when the decoder refuses a frame's window.
type zstdLimited struct {
	r   io.Reader
	max int64
}

func (z *zstdLimited) Read(p []byte) (int, error) {
	n, err := z.r.Read(p)
	if errors.Is(err, zstd.ErrWindowSizeExceeded) && z.max > 0 {
		err = fmt.Errorf("%w of %d bytes: %w", ErrDecoderWindow, z.max, err)
	}
	return n, err
}

// tarStream is what archive/tar reads the tar from. archive/tar keeps an
// entry's sparse map to itself and hands the holes over as zeros to read
// through, so a few kilobytes of tar could declare a petabyte of holes to
// read. tarStream records the raw bytes archive/tar reads while it parses
// an entry's headers, for sparseMap to read the map from, and lets Apply
// read the entry's data from the stream itself, writing the data
// fragments where they belong and skipping the holes; archive/tar is then
// owed as many placeholder bytes as Apply took, so that it finds the next
// header where the stream has it.
type tarStream struct {
	r         io.Reader // the tar stream
	pos       int64     // tar offset of the next byte archive/tar reads
	owed      int64     // placeholder bytes archive/tar gets before r again
	recording bool
	rec       []byte // raw bytes read since recording started
	recStart  int64  // tar offset of rec[0]
}

// maxHeaderBytes bounds what one entry's headers may take: archive/tar
// allows 1 MiB for each of a PAX header, a long name, a long link target
// and a sparse map.
const maxHeaderBytes = 8 << 20

var errHeadersTooLong = errors.New("headers of one entry exceed 8 MiB")

func (t *tarStream) Read(p []byte) (int, error) {
	if t.owed > 0 {
		n := int(min(int64(len(p)), t.owed))
		clear(p[:n])
		t.owed -= int64(n)
		t.pos += int64(n)
		return n, nil
	}
	n, err := t.r.Read(p)
	if t.recording && n > 0 {
		if len(t.rec) == 0 {
			t.recStart = t.pos
		}
		if len(t.rec)+n > maxHeaderBytes {
			return 0, errHeadersTooLong
		}
		t.rec = append(t.rec, p[:n]...)
	}
	t.pos += int64(n)
	return n, err
}

// record starts recording; the previous entry's data must have been read
// (or owed) to its end, so that the first byte recorded is its padding or
// the next header.
func (t *tarStream) record() {
	t.rec = t.rec[:0]
	t.recording = true
	t.recStart = t.pos + t.owed
}

// sparseData is a data fragment of a sparse entry: length bytes at offset.
type sparseData struct{ offset, length int64 }

// sparseEntry is where the data of a sparse entry goes, and how many
// bytes of it the stream holds (the sum of the lengths).
type sparseEntry struct {
	data     []sparseData
	physical int64
}

const blockSize = 512

// sparseMap returns the sparse map of the entry archive/tar just read
// (nil for an entry that is not sparse), from the headers recorded while
// it read them. It recognises what archive/tar recognises: old GNU 'S'
// entries and GNU's PAX formats 0.0, 0.1 and 1.0. A map that does not
// match the data the entry holds is refused, as archive/tar would refuse
// it when reading the data.
func (t *tarStream) sparseMap(hdr *tar.Header) (*sparseEntry, error) {
	t.recording = false
	format := sparseFormatOf(hdr)
	if format == notSparse {
		return nil, nil
	}
	rec := t.rec
	blk, hdrEnd, err := t.entryHeader()
	if err != nil {
		return nil, err
	}
	stored, ok := parseNumeric(blk[124:136])
	if v := hdr.PAXRecords["size"]; v != "" {
		stored, ok = parseDecimal(v)
	}
	if !ok {
		return nil, errors.New("sparse entry: bad size field")
	}
	var data []sparseData
	switch format {
	case sparseOldGNU:
		data, err = oldGNUSparseMap(rec, blk, hdrEnd)
	case sparsePAX1:
		data, err = pax1SparseMap(rec[hdrEnd:])
		stored -= int64(len(rec) - hdrEnd)
	default:
		data, err = pax0SparseMap(hdr.PAXRecords["GNU.sparse.map"])
	}
	if err != nil {
		return nil, err
	}
	if err := checkSparseMap(data, hdr.Size, stored); err != nil {
		return nil, err
	}
	return &sparseEntry{data: data, physical: stored}, nil
}

// sparseFormat is how an entry records its sparse map.
type sparseFormat int

const (
	notSparse    sparseFormat = iota
	sparseOldGNU              // 'S' entries: the map in the header and extension blocks
	sparsePAX0                // GNU PAX 0.0 and 0.1: the map in a PAX record
	sparsePAX1                // GNU PAX 1.0: the map at the start of the data
)

func sparseFormatOf(hdr *tar.Header) sparseFormat {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return sparseOldGNU
	}
	major, minor := hdr.PAXRecords["GNU.sparse.major"], hdr.PAXRecords["GNU.sparse.minor"]
	switch {
	case major == "0" && (minor == "0" || minor == "1"):
		return sparsePAX0
	case major == "1" && minor == "0":
		return sparsePAX1
	case major != "" || minor != "":
		return notSparse // archive/tar reads an unknown version as a plain file
	case hdr.PAXRecords["GNU.sparse.map"] != "":
		return sparsePAX0
	}
	return notSparse
}

// entryHeader walks the recorded headers, past extended headers and long
// names, to the entry's own header block; it returns the block and the
// offset in the record just after it.
func (t *tarStream) entryHeader() ([]byte, int, error) {
	rec := t.rec
	off := int((t.recStart+blockSize-1)/blockSize*blockSize - t.recStart)
	for {
		if off < 0 || off+blockSize > len(rec) {
			return nil, 0, errors.New("sparse entry: header not found in the stream")
		}
		b := rec[off : off+blockSize]
		switch b[156] {
		case tar.TypeXHeader, tar.TypeGNULongName, tar.TypeGNULongLink:
			n, ok := parseNumeric(b[124:136])
			if !ok || n < 0 || n > maxHeaderBytes {
				return nil, 0, errors.New("sparse entry: bad extended header size")
			}
			off += blockSize + int((n+blockSize-1)/blockSize*blockSize)
			continue
		}
		return b, off + blockSize, nil
	}
}

// oldGNUSparseMap reads four entries in the header blk, 21 in each
// extension block after it at hdrEnd in rec; a flag byte after the
// entries says whether another block follows.
func oldGNUSparseMap(rec, blk []byte, hdrEnd int) ([]sparseData, error) {
	var data []sparseData
	entries, ext, next := blk[386:482], blk[482], hdrEnd
	for {
		for i := 0; i+24 <= len(entries) && entries[i] != 0; i += 24 {
			o, ok1 := parseNumeric(entries[i : i+12])
			l, ok2 := parseNumeric(entries[i+12 : i+24])
			if !ok1 || !ok2 {
				return nil, errors.New("sparse entry: bad map entry")
			}
			data = append(data, sparseData{o, l})
		}
		if ext == 0 {
			return data, nil
		}
		if next+blockSize > len(rec) {
			return nil, errors.New("sparse entry: extension block not found in the stream")
		}
		b := rec[next : next+blockSize]
		entries, ext, next = b[:504], b[504], next+blockSize
	}
}

// pax1SparseMap reads newline-terminated decimals at the start of the
// data, whole blocks of which archive/tar has read already.
func pax1SparseMap(head []byte) ([]sparseData, error) {
	toks := strings.Split(string(head), "\n")
	n, ok := int64(0), len(toks) > 0
	if ok {
		n, ok = parseDecimal(toks[0])
	}
	if !ok || n < 0 || int64(len(toks)-1) < 2*n {
		return nil, errors.New("sparse entry: bad map")
	}
	var data []sparseData
	for i := int64(0); i < n; i++ {
		o, ok1 := parseDecimal(toks[1+2*i])
		l, ok2 := parseDecimal(toks[2+2*i])
		if !ok1 || !ok2 {
			return nil, errors.New("sparse entry: bad map entry")
		}
		data = append(data, sparseData{o, l})
	}
	return data, nil
}

// pax0SparseMap reads the comma-separated offsets and lengths of a
// GNU.sparse.map record.
func pax0SparseMap(rec string) ([]sparseData, error) {
	m := strings.Split(rec, ",")
	if len(m)%2 != 0 {
		return nil, errors.New("sparse entry: bad map")
	}
	var data []sparseData
	for i := 0; i < len(m); i += 2 {
		o, ok1 := parseDecimal(m[i])
		l, ok2 := parseDecimal(m[i+1])
		if !ok1 || !ok2 {
			return nil, errors.New("sparse entry: bad map entry")
		}
		data = append(data, sparseData{o, l})
	}
	return data, nil
}

// checkSparseMap refuses fragments out of order or beyond the size, and a
// map whose data is not the stored data.
func checkSparseMap(data []sparseData, size, stored int64) error {
	var end, sum int64
	for _, d := range data {
		if d.offset < end || d.length < 0 || d.offset > size-d.length {
			return fmt.Errorf("sparse entry: fragment of %d bytes at %d out of order or beyond the size %d", d.length, d.offset, size)
		}
		end = d.offset + d.length
		sum += d.length
	}
	if sum != stored {
		return fmt.Errorf("sparse entry: map holds %d bytes of data, the stream %d", sum, stored)
	}
	return nil
}

func parseDecimal(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n >= 0
}

// parseNumeric reads a tar number field as archive/tar does: octal,
// padded with spaces and NULs, or base-256 when the top bit is set.
func parseNumeric(b []byte) (int64, bool) {
	if len(b) > 0 && b[0]&0x80 != 0 {
		if b[0]&0x40 != 0 {
			return 0, false // negative
		}
		var x uint64
		for i, c := range b {
			if i == 0 {
				c &= 0x7f
			}
			if x>>56 != 0 {
				return 0, false
			}
			x = x<<8 | uint64(c)
		}
		return int64(x), x>>63 == 0
	}
	b = bytes.Trim(b, " \x00")
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	if len(b) == 0 {
		return 0, true
	}
	n, err := strconv.ParseUint(string(b), 8, 63)
	return int64(n), err == nil
}
