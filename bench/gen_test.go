package bench

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestGenerateLayer(t *testing.T) {
	spec := LayerSpec{Files: 500, Bytes: 5 << 20, Seed: 1}
	var buf bytes.Buffer
	n, err := GenerateLayer(&buf, spec)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	var files, entries, whiteouts int
	var content int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		entries++
		if h.Typeflag == tar.TypeReg && h.Size > 0 {
			files++
			content += h.Size
		}
		if h.Typeflag == tar.TypeReg && h.Size == 0 {
			whiteouts++
		}
	}
	if entries != n {
		t.Errorf("GenerateLayer reported %d entries, the tar has %d", n, entries)
	}
	if files != spec.Files || content != spec.Bytes {
		t.Errorf("%d files with %d bytes, want %d with %d", files, content, spec.Files, spec.Bytes)
	}
	if whiteouts == 0 {
		t.Error("no whiteout entries")
	}
	var again bytes.Buffer
	if _, err := GenerateLayer(&again, spec); err != nil {
		t.Fatal(err)
	}
	var first bytes.Buffer
	if _, err := GenerateLayer(&first, spec); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first.Bytes(), again.Bytes()) {
		t.Error("the same spec gave two different layers")
	}
	if _, err := GenerateLayer(io.Discard, LayerSpec{Files: 0, Bytes: 10}); err == nil {
		t.Error("an empty spec was accepted")
	}
}
