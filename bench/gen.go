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
	rng := rand.New(rand.NewSource(spec.Seed))
	mtime := time.Unix(1700000000, 0)
	tw := tar.NewWriter(w)
	entries := 0
	write := func(h *tar.Header, body []byte) error {
		h.ModTime = mtime
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("write header %s: %w", h.Name, err)
		}
		if len(body) > 0 {
			if _, err := tw.Write(body); err != nil {
				return fmt.Errorf("write %s: %w", h.Name, err)
			}
		}
		entries++
		return nil
	}

	// Sizes first: a log-uniform spread from 64 bytes to 1 MiB, scaled to
	// the requested total.
	sizes := make([]float64, spec.Files)
	var sum float64
	for i := range sizes {
		sizes[i] = 64 * float64(int(1)<<rng.Intn(15)) * (1 + rng.Float64())
		sum += sizes[i]
	}
	scale := float64(spec.Bytes) / sum
	var maxSize int64
	ints := make([]int64, spec.Files)
	var total int64
	for i, s := range sizes {
		ints[i] = max(1, int64(s*scale))
		total += ints[i]
		maxSize = max(maxSize, ints[i])
	}
	ints[0] += spec.Bytes - total // exact total
	maxSize = max(maxSize, ints[0])

	words := make([][]byte, 512)
	for i := range words {
		w := make([]byte, 2+rng.Intn(9))
		for j := range w {
			w[j] = byte('a' + rng.Intn(26))
		}
		words[i] = w
	}
	buf := make([]byte, maxSize)
	content := xorshift(spec.Seed*2 + 1)

	dirs := make([]string, 0, spec.Files/25+1)
	for i := 0; i < cap(dirs); i++ {
		name := fmt.Sprintf("d%04d", i)
		if len(dirs) > 0 && rng.Intn(4) > 0 {
			name = dirs[rng.Intn(len(dirs))] + "/" + name
		}
		dirs = append(dirs, name)
		if err := write(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755}, nil); err != nil {
			return entries, err
		}
	}
	for i, size := range ints {
		body := buf[:size]
		if i%2 == 1 {
			content.fill(body)
		} else {
			content.fillText(body, words)
		}
		name := fmt.Sprintf("%s/f%05d", dirs[rng.Intn(len(dirs))], i)
		mode := int64(0o644)
		if i%7 == 0 {
			mode = 0o755
		}
		if err := write(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: size, Uid: i % 3, Gid: i % 5}, body); err != nil {
			return entries, err
		}
		switch i % 100 {
		case 1:
			if err := write(&tar.Header{Typeflag: tar.TypeSymlink, Name: name + ".sym", Linkname: "../lib/target", Mode: 0o777}, nil); err != nil {
				return entries, err
			}
		case 2:
			// Real tars repeat the inode's metadata on its hard links.
			if err := write(&tar.Header{Typeflag: tar.TypeLink, Name: name + ".lnk", Linkname: name, Mode: mode, Uid: i % 3, Gid: i % 5}, nil); err != nil {
				return entries, err
			}
		case 3:
			if err := write(&tar.Header{Typeflag: tar.TypeReg, Name: name + ".wh-dir/.wh.removed", Mode: 0o600}, nil); err != nil {
				return entries, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return entries, fmt.Errorf("close tar: %w", err)
	}
	return entries, nil
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
