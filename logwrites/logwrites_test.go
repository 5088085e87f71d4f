package logwrites

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"reflect"
	"testing"
)

// rec is one entry of a synthetic log.
type rec struct {
	sector, nr uint64
	flags      uint64
	mark       string
	fill       byte // the data: nr sectors of this byte
}

// encode writes a log the way the target lays it out, from the format
// description: a super sector, then per entry a header sector and its data.
func encode(ss int, recs []rec) []byte {
	le := binary.LittleEndian
	buf := make([]byte, ss)
	le.PutUint64(buf[0:], Magic)
	le.PutUint64(buf[8:], Version)
	le.PutUint64(buf[16:], uint64(len(recs)))
	le.PutUint32(buf[24:], uint32(ss))
	for _, r := range recs {
		h := make([]byte, ss)
		le.PutUint64(h[0:], r.sector)
		le.PutUint64(h[8:], r.nr)
		le.PutUint64(h[16:], r.flags)
		le.PutUint64(h[24:], uint64(len(r.mark)))
		copy(h[32:], r.mark)
		buf = append(buf, h...)
		if r.flags&(FlagDiscard|FlagMark) == 0 {
			buf = append(buf, bytes.Repeat([]byte{r.fill}, int(r.nr)*ss)...)
		}
	}
	return buf
}

// image is an io.WriterAt over a fixed-size byte slice.
type image []byte

func (im image) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(im)) {
		return 0, fmt.Errorf("write %d bytes at %d beyond %d", len(p), off, len(im))
	}
	return copy(im[off:], p), nil
}

func sample() []rec {
	return []rec{
		{sector: 0, nr: 2, fill: 'a'},
		{sector: 4, nr: 1, fill: 'b'},
		{flags: FlagFlush},
		{mark: "one", flags: FlagMark},
		{sector: 1, nr: 2, fill: 'c', flags: FlagFUA},
		{sector: 6, nr: 2, flags: FlagDiscard},
		{sector: 5, nr: 1, fill: 'd', flags: FlagMetadata},
		{sector: 2, nr: 1, fill: 'e'},
		{sector: 0, nr: 1, fill: 'f', flags: FlagFlush | FlagFUA},
		{sector: 7, nr: 1, fill: 'g'},
	}
}

func decodeBytes(t *testing.T, b []byte) *Log {
	t.Helper()
	l, err := Decode(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	return l
}

func TestDecode(t *testing.T) {
	for _, ss := range []int{512, 4096} {
		l := decodeBytes(t, encode(ss, sample()))
		if l.SectorSize != uint32(ss) || l.Version != Version || len(l.Entries) != 10 {
			t.Fatalf("sector size %d: super %+v with %d entries", ss, l.Super, len(l.Entries))
		}
		e := l.Entries[3]
		if !e.IsMark() || e.Mark != "one" {
			t.Errorf("entry 3 = %v, want the mark \"one\"", e)
		}
		e = l.Entries[4]
		if !e.IsFUA() || e.Sector != 1 || e.NrSectors != 2 {
			t.Errorf("entry 4 = %v, want a FUA write of sectors 1+2", e)
		}
		// Header sector and data of entries 0 and 1, the flush's and
		// the mark's header sector, then entry 4's header.
		if want := int64(ss * (1 + (1 + 2) + (1 + 1) + 1 + 1 + 1)); e.DataOffset != want {
			t.Errorf("entry 4 data at %d, want %d", e.DataOffset, want)
		}
	}
}

func TestReplay(t *testing.T) {
	const ss = 512
	l := decodeBytes(t, encode(ss, sample()))
	state := func(n int) image {
		im := make(image, 8*ss)
		for i := range im {
			im[i] = '.'
		}
		if err := l.Replay(im, 0, n); err != nil {
			t.Fatalf("replay %d entries: %v", n, err)
		}
		return im
	}
	// One character per sector.
	summary := func(im image) string {
		var s []byte
		for i := 0; i < len(im); i += ss {
			for _, c := range im[i : i+ss] {
				if c != im[i] {
					t.Fatalf("sector %d is not uniform", i/ss)
				}
			}
			if im[i] == 0 {
				s = append(s, '0')
			} else {
				s = append(s, im[i])
			}
		}
		return string(s)
	}
	for n, want := range map[int]string{
		0:  "........",
		2:  "aa..b...",
		4:  "aa..b...",
		5:  "acc.b...",
		6:  "acc.b.00",
		8:  "ace.bd00",
		9:  "fce.bd00",
		10: "fce.bd0g",
	} {
		if got := summary(state(n)); got != want {
			t.Errorf("after %d entries: %s, want %s", n, got, want)
		}
	}
	// Replaying in steps gives the same image as in one go.
	im := state(3)
	if err := l.Replay(im, 3, 7); err != nil {
		t.Fatal(err)
	}
	if err := l.Replay(im, 7, 10); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(im, state(10)) {
		t.Error("replay in steps differs from replay in one go")
	}
	if err := l.Replay(im, 4, 11); err == nil {
		t.Error("replay past the last entry succeeded")
	}
	if err := l.Replay(make(image, 4*ss), 0, 10); err == nil {
		t.Error("replay onto a device too small succeeded")
	}
}

// discarder records discards instead of writing zeros.
type discarder struct {
	image
	got [][2]int64
}

func (d *discarder) Discard(off, n int64) error {
	d.got = append(d.got, [2]int64{off, n})
	return nil
}

func TestReplayDiscarder(t *testing.T) {
	l := decodeBytes(t, encode(512, sample()))
	d := &discarder{image: make(image, 8*512)}
	if err := l.Replay(d, 0, 10); err != nil {
		t.Fatal(err)
	}
	if want := [][2]int64{{6 * 512, 2 * 512}}; !reflect.DeepEqual(d.got, want) {
		t.Errorf("discards %v, want %v", d.got, want)
	}
}

func TestPoints(t *testing.T) {
	l := decodeBytes(t, encode(512, sample()))
	got := l.Points(0)
	want := []Point{
		{Applied: 3, Why: "flush"},
		{Applied: 4, Why: "mark", Mark: "one"},
		{Applied: 5, Why: "fua", Mark: "one"},
		{Applied: 9, Why: "flush+fua", Mark: "one"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Points(0) = %+v\nwant %+v", got, want)
	}
	got = l.Points(1)
	want = []Point{
		{Applied: 1, Why: "between"},
		{Applied: 3, Why: "flush"},
		{Applied: 4, Why: "mark", Mark: "one"},
		{Applied: 5, Why: "fua", Mark: "one"},
		{Applied: 7, Why: "between", Mark: "one"},
		{Applied: 9, Why: "flush+fua", Mark: "one"},
		{Applied: 10, Why: "between", Mark: "one"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Points(1) = %+v\nwant %+v", got, want)
	}
}

func TestSample(t *testing.T) {
	var pts []Point
	for i := 1; i <= 100; i++ {
		why := "flush"
		if i%30 == 0 {
			why = "mark"
		}
		pts = append(pts, Point{Applied: i, Why: why})
	}
	got := Sample(pts, 10)
	if len(got) != 10 {
		t.Fatalf("Sample kept %d points, want 10", len(got))
	}
	marks := 0
	for i, p := range got {
		if p.Why == "mark" {
			marks++
		}
		if i > 0 && p.Applied <= got[i-1].Applied {
			t.Errorf("points out of order: %+v", got)
		}
	}
	if marks != 3 {
		t.Errorf("Sample kept %d of 3 marks", marks)
	}
	if len(Sample(pts[:5], 10)) != 5 {
		t.Error("Sample dropped points under its limit")
	}
}

func TestDecodeRejects(t *testing.T) {
	good := encode(512, sample())
	le := binary.LittleEndian
	for _, c := range []struct {
		name string
		edit func(b []byte) []byte
	}{
		{"short", func(b []byte) []byte { return b[:100] }},
		{"magic", func(b []byte) []byte { b[0] ^= 1; return b }},
		{"version", func(b []byte) []byte { le.PutUint64(b[8:], 2); return b }},
		{"sector size", func(b []byte) []byte { le.PutUint32(b[24:], 1000); return b }},
		{"too many entries", func(b []byte) []byte { le.PutUint64(b[16:], 1<<60); return b }},
		{"sector larger than the log", func(b []byte) []byte {
			le.PutUint32(b[24:], 4096)
			le.PutUint64(b[16:], 1<<60)
			return b[:512]
		}},
		{"truncated data", func(b []byte) []byte { return b[:len(b)-512] }},
		{"huge write", func(b []byte) []byte { le.PutUint64(b[512+8:], 1<<61); return b }},
		{"unknown flag", func(b []byte) []byte { le.PutUint64(b[512+16:], 1<<9); return b }},
		{"data on a write", func(b []byte) []byte { le.PutUint64(b[512+24:], 3); return b }},
		{"long mark", func(b []byte) []byte { le.PutUint64(b[512*7+24:], 500); return b }},
		{"overflowing range", func(b []byte) []byte {
			le.PutUint64(b[512:], ^uint64(0))
			return b
		}},
	} {
		b := c.edit(append([]byte(nil), good...))
		_, err := Decode(bytes.NewReader(b), int64(len(b)))
		if err == nil {
			t.Errorf("%s: Decode accepted a damaged log", c.name)
			continue
		}
		if !errors.Is(err, ErrFormat) && !errors.Is(err, io.EOF) {
			t.Errorf("%s: %v is neither ErrFormat nor a read error", c.name, err)
		}
	}
}

// FuzzDecode feeds damaged logs to Decode and replays what it accepts: no
// input may panic, allocate more than its size allows or make Replay
// write outside the ranges its entries name.
func FuzzDecode(f *testing.F) {
	f.Add(encode(512, sample()))
	f.Add(encode(4096, sample()[:4]))
	f.Add(encode(512, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := Decode(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		if uint64(len(l.Entries)) != l.Super.Entries {
			t.Fatalf("super says %d entries, decoded %d", l.Super.Entries, len(l.Entries))
		}
		for _, p := range l.Points(2) {
			if p.Applied < 0 || p.Applied > len(l.Entries) {
				t.Fatalf("point %+v outside the log of %d entries", p, len(l.Entries))
			}
		}
		// A small device: writes beyond it fail, and must fail
		// cleanly.
		im := make(image, 64<<10)
		_ = l.Replay(im, 0, len(l.Entries))
	})
}
