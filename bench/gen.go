package bench

import (
	"archive/tar"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand"
	"time"
)

// LayerSpec describes a synthetic image layer.
type LayerSpec struct {
	Files int   // regular files
	Bytes int64 // their total content
	Seed  int64
}

// GenerateLayer writes a tar layer shaped like a distribution image: a
// directory tree, mostly small files with a tail of large ones scaled so
// that the content adds up to spec.Bytes, half of them text (random words,
// compressing about 2.5:1 like binaries and scripts do) and half random
// bytes, plus symlinks, hard links and a few whiteouts so that the overlay
// conversion is exercised. Every file's content is generated afresh: a
// shared pool would let zstd's long window compress the layer to almost
// nothing. It returns the number of entries written.
func GenerateLayer(w io.Writer, spec LayerSpec) (int, error) {
	if spec.Files <= 0 || spec.Bytes < int64(spec.Files) {
		return 0, fmt.Errorf("layer spec %+v: need files > 0 and at least one byte per file", spec)
	}
	// One generator, drawn from in a fixed order (sizes, words,
	// directories, files), so a seed always gives the same layer.
	rng := rand.New(rand.NewSource(spec.Seed))
	sizes, maxSize := fileSizes(rng, spec)
	words := wordList(rng)
	lw := &layerWriter{tw: tar.NewWriter(w), mtime: time.Unix(1700000000, 0)}
	dirs, err := lw.dirs(rng, spec.Files/25+1)
	if err != nil {
		return lw.entries, err
	}
	buf := make([]byte, maxSize)
	content := xorshift(spec.Seed*2 + 1)
	for i, size := range sizes {
		body := buf[:size]
		if i%2 == 1 {
			content.fill(body)
		} else {
			content.fillText(body, words)
		}
		name := fmt.Sprintf("%s/f%05d", dirs[rng.Intn(len(dirs))], i)
		if err := lw.file(i, name, body); err != nil {
			return lw.entries, err
		}
	}
	if err := lw.tw.Close(); err != nil {
		return lw.entries, fmt.Errorf("close tar: %w", err)
	}
	return lw.entries, nil
}

// fileSizes spreads spec.Bytes over spec.Files files: log-uniform from 64
// bytes to 1 MiB, scaled to the exact total. It also returns the largest.
func fileSizes(rng *rand.Rand, spec LayerSpec) ([]int64, int64) {
	sizes := make([]float64, spec.Files)
	var sum float64
	for i := range sizes {
		sizes[i] = 64 * float64(int(1)<<rng.Intn(15)) * (1 + rng.Float64())
		sum += sizes[i]
	}
	scale := float64(spec.Bytes) / sum
	var maxSize, total int64
	ints := make([]int64, spec.Files)
	for i, s := range sizes {
		ints[i] = max(1, int64(s*scale))
		total += ints[i]
		maxSize = max(maxSize, ints[i])
	}
	ints[0] += spec.Bytes - total // exact total
	return ints, max(maxSize, ints[0])
}

// wordList is the vocabulary of the text files.
func wordList(rng *rand.Rand) [][]byte {
	words := make([][]byte, 512)
	for i := range words {
		w := make([]byte, 2+rng.Intn(9))
		for j := range w {
			w[j] = byte('a' + rng.Intn(26))
		}
		words[i] = w
	}
	return words
}

// A layerWriter writes a layer's entries and counts them.
type layerWriter struct {
	tw      *tar.Writer
	mtime   time.Time
	entries int
}

func (lw *layerWriter) write(h *tar.Header, body []byte) error {
	h.ModTime = lw.mtime
	if err := lw.tw.WriteHeader(h); err != nil {
		return fmt.Errorf("write header %s: %w", h.Name, err)
	}
	if len(body) > 0 {
		if _, err := lw.tw.Write(body); err != nil {
			return fmt.Errorf("write %s: %w", h.Name, err)
		}
	}
	lw.entries++
	return nil
}

// dirs writes n directories, three in four nested in an earlier one, and
// returns their names.
func (lw *layerWriter) dirs(rng *rand.Rand, n int) ([]string, error) {
	dirs := make([]string, 0, n)
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("d%04d", i)
		if len(dirs) > 0 && rng.Intn(4) > 0 {
			name = dirs[rng.Intn(len(dirs))] + "/" + name
		}
		dirs = append(dirs, name)
		if err := lw.write(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755}, nil); err != nil {
			return dirs, err
		}
	}
	return dirs, nil
}

// file writes file i and, for some i, a symlink, a hard link or a
// whiteout next to it.
func (lw *layerWriter) file(i int, name string, body []byte) error {
	mode := int64(0o644)
	if i%7 == 0 {
		mode = 0o755
	}
	if err := lw.write(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), Uid: i % 3, Gid: i % 5}, body); err != nil {
		return err
	}
	switch i % 100 {
	case 1:
		return lw.write(&tar.Header{Typeflag: tar.TypeSymlink, Name: name + ".sym", Linkname: "../lib/target", Mode: 0o777}, nil)
	case 2:
		// Real tars repeat the inode's metadata on its hard links.
		return lw.write(&tar.Header{Typeflag: tar.TypeLink, Name: name + ".lnk", Linkname: name, Mode: mode, Uid: i % 3, Gid: i % 5}, nil)
	case 3:
		return lw.write(&tar.Header{Typeflag: tar.TypeReg, Name: name + ".wh-dir/.wh.removed", Mode: 0o600}, nil)
	}
	return nil
}

// xorshift generates file content. The benchmarks generate their layer
// inside an emulated guest, where math/rand's per-call cost made the
// 50 MiB take minutes; this produces eight bytes per step.
type xorshift uint64

func (x *xorshift) next() uint64 {
	v := uint64(*x)
	v ^= v << 13
	v ^= v >> 7
	v ^= v << 17
	*x = xorshift(v)
	return v
}

// fill fills b with random bytes.
func (x *xorshift) fill(b []byte) {
	for len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, x.next())
		b = b[8:]
	}
	var t [8]byte
	binary.LittleEndian.PutUint64(t[:], x.next())
	copy(b, t[:])
}

// fillText fills b with lines of random words, seven word choices (9 bits
// each, so len(words) must be 512) per step.
func (x *xorshift) fillText(b []byte, words [][]byte) {
	var v uint64
	left := 0
	for i := 0; i < len(b); {
		if left == 0 {
			v, left = x.next(), 7
		}
		w := v & 511
		v >>= 9
		left--
		i += copy(b[i:], words[w])
		if i < len(b) {
			b[i] = ' '
			if w%10 == 0 {
				b[i] = '\n'
			}
			i++
		}
	}
}
