package layer

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
)

// DigestAlgo names how a FileDigest was computed.
type DigestAlgo string

const (
	// DigestSHA256 is the SHA-256 of the file's content, the digest of
	// every regular file entry that is not sparse.
	DigestSHA256 DigestAlgo = "sha256"
	// DigestSparseSHA256 is the digest of a sparse entry, whose holes can
	// declare terabytes that are never read or written: the SHA-256, over
	// the file cut into SparseBlock-byte blocks at multiples of
	// SparseBlock, of each block that holds a non-zero byte as its offset
	// (8 bytes, big-endian) followed by its bytes (the last block of the
	// file may be shorter), then the file's length (8 bytes,
	// big-endian). Holes and blocks of zeros add nothing, so it is
	// computed from the data fragments alone, and from a file on disk by
	// reading only its data extents (SEEK_DATA).
	DigestSparseSHA256 DigestAlgo = "sparse-sha256"
)

// SparseBlock is the block size of DigestSparseSHA256.
const SparseBlock = 4096

// FileDigest is the digest of one regular file Apply wrote, for
// ApplyOptions.Digest. Dev and Ino identify the file in the finished tree
// whatever names (hard links) lead to it.
type FileDigest struct {
	Dev, Ino uint64
	Size     int64
	Algo     DigestAlgo
	Sum      [sha256.Size]byte
}

// SparseHash computes DigestSparseSHA256 from data written at increasing
// offsets; what lies between two writes is zeros.
type SparseHash struct {
	h     hash.Hash
	blk   [SparseBlock]byte
	cur   int64 // index of the block in blk, -1 for none
	dirty bool  // blk holds a non-zero byte
	end   int64 // end of the data written so far
}

// NewSparseHash returns an empty SparseHash.
func NewSparseHash() *SparseHash {
	return &SparseHash{h: sha256.New(), cur: -1}
}

// Reset empties s for the next file.
func (s *SparseHash) Reset() {
	s.h.Reset()
	s.cur, s.dirty, s.end = -1, false, 0
	clear(s.blk[:])
}

// WriteAt adds p at offset off, which must not be before the end of what
// was written; it reports false otherwise and adds nothing.
func (s *SparseHash) WriteAt(p []byte, off int64) bool {
	if off < s.end {
		return false
	}
	for len(p) > 0 {
		bi, o := off/SparseBlock, off%SparseBlock
		if bi != s.cur {
			s.flush(SparseBlock)
			s.cur = bi
		}
		n := copy(s.blk[o:], p)
		if !s.dirty {
			for _, c := range p[:n] {
				if c != 0 {
					s.dirty = true
					break
				}
			}
		}
		p, off = p[n:], off+int64(n)
	}
	s.end = off
	return true
}

// flush hashes the current block, n bytes long, if it is not all zeros.
func (s *SparseHash) flush(n int) {
	if s.cur >= 0 && s.dirty {
		var o [8]byte
		binary.BigEndian.PutUint64(o[:], uint64(s.cur)*SparseBlock)
		s.h.Write(o[:])
		s.h.Write(s.blk[:n])
	}
	clear(s.blk[:])
	s.cur, s.dirty = -1, false
}

// Sum finishes the digest of a file of length size (at least the end of
// what was written).
func (s *SparseHash) Sum(size int64) [sha256.Size]byte {
	if s.cur >= 0 {
		s.flush(int(min(SparseBlock, size-s.cur*SparseBlock)))
	}
	var l [8]byte
	binary.BigEndian.PutUint64(l[:], uint64(size))
	s.h.Write(l[:])
	var out [sha256.Size]byte
	s.h.Sum(out[:0])
	return out
}
