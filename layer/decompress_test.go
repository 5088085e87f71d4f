package layer

import (
	"bufio"
	"bytes"
	"io"
	"testing"

	"github.com/klauspost/compress/zstd"
)

func TestRoomyHistory(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	enc := func(src []byte, opts ...zstd.EOption) []byte {
		t.Helper()
		var out bytes.Buffer
		w, err := zstd.NewWriter(&out, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(src); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return out.Bytes()
	}
	for _, c := range []struct {
		name string
		in   []byte
		want bool
	}{
		// A streamed frame with zstd's fastest level's 4 MiB window.
		{"window 4 MiB", enc(big, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithWindowSize(4<<20)), true},
		{"window 64 MiB", enc(big, zstd.WithWindowSize(64<<20)), false},
		{"single segment", encodeAll(t, big, zstd.WithSingleSegment(true)), false},
		{"truncated header", magicZstd, false},
		{"not zstd", []byte("plain tar bytes, nothing like a frame"), false},
	} {
		br := bufio.NewReader(bytes.NewReader(c.in))
		if got := roomyHistory(br); got != c.want {
			t.Errorf("%s: roomyHistory = %v, want %v", c.name, got, c.want)
		}
		// The header stays in the reader for the decoder.
		rest, err := io.ReadAll(br)
		if err != nil || !bytes.Equal(rest, c.in) {
			t.Errorf("%s: the reader lost bytes to the peek: %v", c.name, err)
		}
	}
}

func encodeAll(t *testing.T, src []byte, opts ...zstd.EOption) []byte {
	t.Helper()
	w, err := zstd.NewWriter(nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return w.EncodeAll(src, nil)
}

// TestDecompressRoomyHistory applies a layer whose frame takes the larger
// history through decompress, window moves and all: the content must come
// out whole and the checksum must match.
func TestDecompressRoomyHistory(t *testing.T) {
	plain := make([]byte, 12<<20) // three windows and more
	x := uint64(1)
	for i := range plain {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		plain[i] = "abcdefgh"[x%8]
	}
	var z bytes.Buffer
	w, err := zstd.NewWriter(&z, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithWindowSize(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(plain); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if !roomyHistory(bufio.NewReader(bytes.NewReader(z.Bytes()))) {
		t.Fatal("the test frame does not take the larger history")
	}
	r, done, err := decompress(bytes.NewReader(z.Bytes()), DefaultMaxDecoderWindow)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if !bytes.Equal(got, plain) {
		t.Fatalf("decoded %d bytes, not the %d put in", len(got), len(plain))
	}
}
