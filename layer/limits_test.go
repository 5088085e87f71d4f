package layer

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// numField writes a tar number field: octal when it fits, base-256
// otherwise, as GNU tar does for sizes beyond 8 GiB.
func numField(b []byte, v int64) {
	s := fmt.Sprintf("%0*o", len(b)-1, v)
	if len(s) <= len(b)-1 {
		copy(b, s)
		b[len(b)-1] = 0
		return
	}
	clear(b)
	for i := len(b) - 1; i > 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
	b[0] = 0x80
}

// oldGNUSparse is a tar of one old GNU sparse ('S') entry of size bytes
// whose data fragments are given by offset, followed by a plain file: the
// header archive/tar reads back but cannot write. More than four
// fragments go into extension blocks.
func oldGNUSparse(t *testing.T, name string, size int64, frags map[int64]string, offsets []int64) []byte {
	t.Helper()
	var physical int64
	for _, o := range offsets {
		physical += int64(len(frags[o]))
	}
	blk := make([]byte, 512)
	copy(blk, name)
	copy(blk[100:], "0000644\x00")
	copy(blk[108:], "0000000\x00")
	copy(blk[116:], "0000000\x00")
	numField(blk[124:136], physical)
	numField(blk[136:148], baseTime.Unix())
	blk[156] = tar.TypeGNUSparse
	copy(blk[257:], "ustar  \x00")
	var ext [][]byte
	slot, cur, limit := 0, blk[386:482], 4
	for _, o := range offsets {
		if slot == limit {
			// Flag the block full and start an extension block.
			if len(ext) == 0 {
				blk[482] = 1
			} else {
				ext[len(ext)-1][504] = 1
			}
			e := make([]byte, 512)
			ext = append(ext, e)
			slot, cur, limit = 0, e[:504], 21
		}
		numField(cur[slot*24:slot*24+12], o)
		numField(cur[slot*24+12:slot*24+24], int64(len(frags[o])))
		slot++
	}
	numField(blk[483:495], size)
	copy(blk[148:156], "        ")
	var sum int64
	for _, c := range blk {
		sum += int64(c)
	}
	copy(blk[148:156], fmt.Sprintf("%06o\x00 ", sum))
	var buf bytes.Buffer
	buf.Write(blk)
	for _, e := range ext {
		buf.Write(e)
	}
	for _, o := range offsets {
		buf.WriteString(frags[o])
	}
	if pad := buf.Len() % 512; pad != 0 {
		buf.Write(make([]byte, 512-pad))
	}
	// A plain entry after it shows the stream is read from the right place.
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "after", Typeflag: tar.TypeReg, Mode: 0o644, Size: 5, ModTime: baseTime}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(tw, "after"); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A petabyte of declared holes is refused at once by the default size
// limit; before the limits, Apply read its holes as zeros for hours.
func TestApplySparsePetabyteRefused(t *testing.T) {
	const pib = int64(1) << 50
	layer := oldGNUSparse(t, "huge", pib, map[int64]string{pib - 4: "tail"}, []int64{pib - 4})
	if len(layer) > 4096 {
		t.Fatalf("the layer is %d bytes, want a few kilobytes", len(layer))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	root := t.TempDir()
	_, err := Apply(ctx, root, bytes.NewReader(layer), ApplyOptions{})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Apply of a 1 PiB sparse entry: %v, want ErrTooLarge within 10 s", err)
	}
	if !strings.Contains(err.Error(), "MaxSize of 68719476736 bytes") {
		t.Errorf("error %q does not name the limit and its value", err)
	}
}

// With the size limit off, a sparse entry of a terabyte of holes applies
// in moments: holes are neither read nor written.
func TestApplySparseSkipsHoles(t *testing.T) {
	const tib = int64(1) << 40
	frags := map[int64]string{0: "head", 1 << 30: "middle", tib - 4: "tail"}
	layer := oldGNUSparse(t, "big", tib, frags, []int64{0, 1 << 30, tib - 4})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	root := t.TempDir()
	if _, err := Apply(ctx, root, bytes.NewReader(layer), ApplyOptions{Limits: Limits{MaxSize: -1}}); err != nil {
		t.Fatalf("Apply of a 1 TiB sparse entry: %v", err)
	}
	f, err := os.Open(filepath.Join(root, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != tib {
		t.Errorf("size %d, want %d", st.Size, tib)
	}
	if st.Blocks*512 > 1<<20 {
		t.Errorf("%d bytes allocated for 14 bytes of data", st.Blocks*512)
	}
	for off, want := range frags {
		got := make([]byte, len(want)+2)
		n, _ := f.ReadAt(got, off-1)
		if off == 0 {
			n, _ = f.ReadAt(got[1:], 0)
			n++
		}
		wantB := append(append([]byte{0}, want...), 0)
		if off+int64(len(want)) == tib {
			wantB = wantB[:len(wantB)-1]
		}
		if !bytes.Equal(got[:n], wantB) {
			t.Errorf("at %d: %q, want %q", off, got[:n], wantB)
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, "after")); err != nil || string(b) != "after" {
		t.Errorf("entry after the sparse one: %q %v", b, err)
	}
}

// Many fragments use extension blocks; every byte must land where
// archive/tar's own reading puts it.
func TestApplySparseExtensionBlocks(t *testing.T) {
	frags := map[int64]string{}
	var offsets []int64
	for i := int64(0); i < 30; i++ {
		o := i * 10000
		frags[o] = strings.Repeat(string(rune('a'+i%26)), int(i+1))
		offsets = append(offsets, o)
	}
	layer := oldGNUSparse(t, "many", 300005, frags, offsets)
	root := t.TempDir()
	mustApply(t, root, layer, ApplyOptions{})
	got, err := os.ReadFile(filepath.Join(root, "many"))
	if err != nil {
		t.Fatal(err)
	}
	if want := readEntry(t, layer, "many"); !bytes.Equal(got, want) {
		t.Errorf("content differs from archive/tar's reading (%d and %d bytes)", len(got), len(want))
	}
}

// readEntry reads an entry's content with archive/tar, holes as zeros.
func readEntry(t *testing.T, layer []byte, name string) []byte {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		hdr, err := tr.Next()
		if err != nil {
			t.Fatalf("no entry %s: %v", name, err)
		}
		if hdr.Name == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

// goTarTestdata reads a tar from Go's own archive/tar test data: GNU
// tar's encodings of sparse files in every format.
func goTarTestdata(t *testing.T, name string) []byte {
	t.Helper()
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("go env GOROOT: %v", err)
	}
	p := filepath.Join(strings.TrimSpace(string(goroot)), "src", "archive", "tar", "testdata", name)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("Go's archive/tar test data: %v", err)
	}
	if strings.HasSuffix(name, ".base64") {
		if b, err = base64.StdEncoding.DecodeString(string(b)); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// Every sparse format GNU tar writes (old GNU, PAX 0.0, 0.1, 1.0) applies
// to exactly what archive/tar reads.
func TestApplySparseFormats(t *testing.T) {
	layer := goTarTestdata(t, "sparse-formats.tar")
	root := t.TempDir()
	mustApply(t, root, layer, ApplyOptions{})
	tr := tar.NewReader(bytes.NewReader(layer))
	seen := 0
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		want, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(root, hdr.Name))
		if err != nil {
			t.Errorf("%s: %v", hdr.Name, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes differ from archive/tar's %d", hdr.Name, len(got), len(want))
		}
		seen++
	}
	if seen < 5 {
		t.Errorf("only %d entries compared", seen)
	}
}

// GNU tar's 60 GB sparse files, old GNU and PAX 1.0, apply in moments.
func TestApplySparseBig(t *testing.T) {
	for _, name := range []string{"gnu-sparse-big.tar.base64", "pax-sparse-big.tar.base64"} {
		t.Run(name, func(t *testing.T) {
			layer := goTarTestdata(t, name)
			tr := tar.NewReader(bytes.NewReader(layer))
			hdr, err := tr.Next()
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			root := t.TempDir()
			if _, err := Apply(ctx, root, bytes.NewReader(layer), ApplyOptions{}); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			fi, err := os.Stat(filepath.Join(root, hdr.Name))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size() != hdr.Size || hdr.Size < 1<<35 {
				t.Errorf("size %d, want %d", fi.Size(), hdr.Size)
			}
		})
	}
}

func TestApplyMaxEntries(t *testing.T) {
	var es []ent
	for i := 0; i < 10; i++ {
		es = append(es, reg(fmt.Sprintf("f%d", i), "x", 0o644))
	}
	if _, err := applyBytes(t, t.TempDir(), mkTar(t, es...), ApplyOptions{Limits: Limits{MaxEntries: 10}}); err != nil {
		t.Errorf("layer of exactly MaxEntries: %v", err)
	}
	es = append(es, dir("d", 0o755))
	_, err := applyBytes(t, t.TempDir(), mkTar(t, es...), ApplyOptions{Limits: Limits{MaxEntries: 10}})
	if !errors.Is(err, ErrTooManyEntries) || !strings.Contains(err.Error(), "MaxEntries of 10 entries") {
		t.Errorf("layer of MaxEntries+1: %v, want ErrTooManyEntries naming the limit", err)
	}
	var ee *EntryError
	if !errors.As(err, &ee) || ee.Name != "d" {
		t.Errorf("error %v does not name the entry d", err)
	}
}

func TestApplyMaxDepth(t *testing.T) {
	lim := ApplyOptions{Limits: Limits{MaxDepth: 3}}
	if _, err := applyBytes(t, t.TempDir(), mkTar(t, reg("a/b/c", "x", 0o644)), lim); err != nil {
		t.Errorf("entry of exactly MaxDepth: %v", err)
	}
	_, err := applyBytes(t, t.TempDir(), mkTar(t, reg("a/b/c/d", "x", 0o644)), lim)
	if !errors.Is(err, ErrTooDeep) || !strings.Contains(err.Error(), "MaxDepth of 3") {
		t.Errorf("entry of MaxDepth+1: %v, want ErrTooDeep naming the limit", err)
	}
	// A symlink takes a short name deeper than it says.
	_, err = applyBytes(t, t.TempDir(), mkTar(t, dir("a", 0o755), dir("a/b", 0o755), symlink("l", "a/b"), dir("l/c", 0o755), dir("l/c/d", 0o755)), lim)
	if !errors.Is(err, ErrTooDeep) {
		t.Errorf("directory four deep through a symlink: %v, want ErrTooDeep", err)
	}
}

// zstdWithWindow compresses layer and rewrites its frame header to ask
// for a window of 2^log bytes; a larger window than the data used is
// still a valid frame.
func zstdWithWindow(t *testing.T, layer []byte, log uint) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1), zstd.WithSingleSegment(false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(layer); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if b[4]&0x20 != 0 || b[4]&0x03 != 0 {
		t.Fatalf("frame header descriptor %#x: single segment or dictionary, no window byte to rewrite", b[4])
	}
	b[5] = byte(log-10) << 3
	return b
}

// A zstd frame asking for a 512 MiB window is refused before the decoder
// allocates it; before the limits, it was accepted.
func TestApplyZstdWindowLimit(t *testing.T) {
	plain := mkTar(t, reg("f", "hello", 0o644))
	big := zstdWithWindow(t, plain, 29)
	if _, err := applyBytes(t, t.TempDir(), big, ApplyOptions{Limits: Limits{MaxDecoderWindow: -1}}); err != nil {
		t.Fatalf("the rewritten frame does not decode without the limit: %v", err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := applyBytes(t, t.TempDir(), big, ApplyOptions{})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrDecoderWindow) || !strings.Contains(err.Error(), "MaxDecoderWindow of 134217728 bytes") {
		t.Fatalf("512 MiB window: %v, want ErrDecoderWindow naming the limit", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Errorf("refusing the frame allocated %d MiB", grew>>20)
	}
	if _, err := applyBytes(t, t.TempDir(), zstdWithWindow(t, plain, 27), ApplyOptions{}); err != nil {
		t.Errorf("128 MiB window, the default limit: %v", err)
	}
}
