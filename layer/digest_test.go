package layer

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// collectDigests applies b beneath root and returns the digests Apply
// reported, by inode, the last report of an inode winning.
func collectDigests(t *testing.T, root string, b []byte) map[inodeKey]FileDigest {
	t.Helper()
	got := map[inodeKey]FileDigest{}
	mustApply(t, root, b, ApplyOptions{Digest: func(d FileDigest) { got[inodeKey{d.Dev, d.Ino}] = d }})
	return got
}

// TestApplyDigest: every regular file of the finished tree was reported
// with the SHA-256 of what it holds, hard links and replaced entries
// included.
func TestApplyDigest(t *testing.T) {
	root := t.TempDir()
	got := collectDigests(t, root, mkTar(t,
		dir("d/", 0o755),
		reg("d/a", "first version", 0o644),
		reg("d/a", "second version, longer", 0o600),
		reg("d/empty", "", 0o644),
		reg("d/zeros", string(make([]byte, 3*holeBlock+17)), 0o644),
		reg("big", string(bytes.Repeat([]byte("0123456789abcdef"), copyBufSize/8+3)), 0o755),
		hardlink("d/b", "d/a"),
		symlink("s", "d/a"),
	))
	seen := 0
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		d, ok := got[inodeKey{uint64(st.Dev), st.Ino}]
		if !ok {
			t.Errorf("%s: no digest reported", p)
			return nil
		}
		body, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if want := sha256.Sum256(body); d.Sum != want || d.Algo != DigestSHA256 || d.Size != int64(len(body)) {
			t.Errorf("%s: digest %s %x size %d, want sha256 %x size %d", p, d.Algo, d.Sum, d.Size, want, len(body))
		}
		seen++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen != 5 {
		t.Errorf("checked %d regular files, want 5 (a, b, empty, zeros, big)", seen)
	}
}

// sparseDigestSpec computes DigestSparseSHA256 as its documentation says,
// from the whole content.
func sparseDigestSpec(body []byte) [sha256.Size]byte {
	h := sha256.New()
	for off := 0; off < len(body); off += SparseBlock {
		blk := body[off:min(off+SparseBlock, len(body))]
		if bytes.Count(blk, []byte{0}) == len(blk) {
			continue
		}
		var o [8]byte
		binary.BigEndian.PutUint64(o[:], uint64(off))
		h.Write(o[:])
		h.Write(blk)
	}
	var l [8]byte
	binary.BigEndian.PutUint64(l[:], uint64(len(body)))
	h.Write(l[:])
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// TestApplyDigestSparse: a sparse entry is reported with the digest its
// definition gives for the whole content, computed from its fragments
// alone (at offsets that are not block-aligned, and one that straddles a
// block boundary).
func TestApplyDigestSparse(t *testing.T) {
	const size = 5*SparseBlock + 123
	frags := map[int64]string{100: "head", SparseBlock - 2: "straddles", 3*SparseBlock + 7: "middle", size - 4: "tail"}
	offsets := []int64{100, SparseBlock - 2, 3*SparseBlock + 7, size - 4}
	root := t.TempDir()
	got := collectDigests(t, root, oldGNUSparse(t, "sp", size, frags, offsets))
	body, err := os.ReadFile(filepath.Join(root, "sp"))
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, "sp"), &st); err != nil {
		t.Fatal(err)
	}
	d := got[inodeKey{uint64(st.Dev), st.Ino}]
	if want := sparseDigestSpec(body); d.Algo != DigestSparseSHA256 || d.Sum != want || d.Size != size {
		t.Fatalf("sparse digest %s %x size %d, want %s %x size %d", d.Algo, d.Sum, d.Size, DigestSparseSHA256, want, size)
	}
	// The same digest from the whole content in one write, and in
	// pieces at arbitrary increasing offsets.
	h := NewSparseHash()
	h.WriteAt(body, 0)
	if h.Sum(size) != d.Sum {
		t.Error("SparseHash of the whole content differs from the digest of the fragments")
	}
	h.Reset()
	for off := 0; off < len(body); off += 1000 {
		h.WriteAt(body[off:min(off+1000, len(body))], int64(off))
	}
	if h.Sum(size) != d.Sum {
		t.Error("SparseHash of the content in pieces differs")
	}
	h.Reset()
	h.WriteAt([]byte("x"), 10)
	if h.WriteAt([]byte("y"), 5) {
		t.Error("SparseHash accepted a write before the end of the previous one")
	}
	// Data that is zeros hashes like a hole.
	h.Reset()
	if a, b := h.Sum(size), sparseDigestSpec(make([]byte, size)); a != b {
		t.Error("digest of a file of holes differs from the definition")
	}
}
