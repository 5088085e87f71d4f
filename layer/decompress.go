package layer

import (
	"bufio"
	"bytes"
	"compress/bzip2"
	"errors"
	"fmt"
	"io"

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
// does not close r.
func decompress(r io.Reader) (io.Reader, func(), error) {
	head := make([]byte, len(magicXz))
	n, err := io.ReadFull(r, head)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, nil, fmt.Errorf("read layer header: %w", err)
	}
	head = head[:n]
	// The header goes back in front of the stream; a plain tar is then
	// read straight from r, without a copy through a buffer.
	src := io.MultiReader(bytes.NewReader(head), r)
	buffered := func() *bufio.Reader { return bufio.NewReaderSize(src, 256<<10) }
	switch {
	case bytes.HasPrefix(head, magicGzip):
		zr, err := gzip.NewReader(buffered())
		if err != nil {
			return nil, nil, fmt.Errorf("gzip layer: %w", err)
		}
		// Layers are one gzip member; a second one would be unusual but is
		// what the format allows, so it is read rather than ignored.
		return zr, func() { _ = zr.Close() }, nil
	case bytes.HasPrefix(head, magicZstd):
		// The default concurrency decodes blocks ahead of the tar reader
		// on a machine with spare CPUs and decodes synchronously on one.
		zr, err := zstd.NewReader(buffered())
		if err != nil {
			return nil, nil, fmt.Errorf("zstd layer: %w", err)
		}
		return zr, zr.Close, nil
	case bytes.HasPrefix(head, magicBzip2):
		return bzip2.NewReader(buffered()), func() {}, nil
	case bytes.HasPrefix(head, magicXz):
		return nil, nil, errors.New("xz-compressed layers are not supported")
	}
	return src, func() {}, nil
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
