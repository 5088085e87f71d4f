package layer

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
)

// benchLayer builds a layer shaped like a distribution image: many small
// files, some medium ones, a few large ones, half text-like (compressible)
// and half random, spread over a directory tree, with symlinks and hard
// links.
func benchLayer(tb testing.TB, files int, seed int64) ([]byte, int64) {
	rng := rand.New(rand.NewSource(seed))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	var content int64
	dirs := []string{}
	for i := 0; i < files/40+1; i++ {
		parent := ""
		if len(dirs) > 0 && rng.Intn(3) > 0 {
			parent = dirs[rng.Intn(len(dirs))] + "/"
		}
		d := fmt.Sprintf("%sdir%03d", parent, i)
		dirs = append(dirs, d)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: baseTime}); err != nil {
			tb.Fatal(err)
		}
	}
	text := bytes.Repeat([]byte("lorem ipsum dolor sit amet, consectetur adipiscing elit\n"), 1<<16)
	random := make([]byte, 4<<20)
	rng.Read(random)
	for i := 0; i < files; i++ {
		var size int
		switch r := rng.Intn(100); {
		case r < 70:
			size = 64 + rng.Intn(4<<10)
		case r < 97:
			size = 4<<10 + rng.Intn(60<<10)
		default:
			size = 256<<10 + rng.Intn(1<<20)
		}
		src := text
		if rng.Intn(2) == 0 {
			src = random
		}
		off := rng.Intn(len(src) - size)
		name := fmt.Sprintf("%s/file%05d", dirs[rng.Intn(len(dirs))], i)
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(size), ModTime: baseTime}
		if err := tw.WriteHeader(hdr); err != nil {
			tb.Fatal(err)
		}
		if _, err := tw.Write(src[off : off+size]); err != nil {
			tb.Fatal(err)
		}
		content += int64(size)
		if i%50 == 0 {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name + ".sym", Linkname: "file", ModTime: baseTime}); err != nil {
				tb.Fatal(err)
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeLink, Name: name + ".lnk", Linkname: name, ModTime: baseTime}); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes(), content
}

// BenchmarkApply measures Apply per compression, and with "+digest" the
// same with ApplyOptions.Digest set: the cost of hashing every file as
// it streams through, which the store pays to record a layer's manifest.
func BenchmarkApply(b *testing.B) {
	plain, content := benchLayer(b, 1000, 1)
	type variant struct {
		name   string
		data   []byte
		digest bool
	}
	var variants []variant
	for _, c := range []variant{{"plain", plain, false}, {"gzip", gzipped(b, plain), false}, {"zstd", zstded(b, plain), false}} {
		variants = append(variants, c, variant{c.name + "+digest", c.data, true})
	}
	for _, tc := range variants {
		b.Run(tc.name, func(b *testing.B) {
			var opts ApplyOptions
			digests := map[inodeKey]FileDigest{}
			if tc.digest {
				opts.Digest = func(d FileDigest) { digests[inodeKey{d.Dev, d.Ino}] = d }
			}
			base := b.TempDir()
			b.SetBytes(content)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				root := filepath.Join(base, fmt.Sprint(i))
				if err := os.Mkdir(root, 0o755); err != nil {
					b.Fatal(err)
				}
				if _, err := Apply(context.Background(), root, bytes.NewReader(tc.data), opts); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				clear(digests)
				if err := os.RemoveAll(root); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

func BenchmarkExport(b *testing.B) {
	plain, content := benchLayer(b, 1000, 1)
	root := b.TempDir()
	mustApply(b, root, plain, ApplyOptions{})
	b.SetBytes(content)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := Export(context.Background(), io.Discard, root, ExportOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChanges compares the native diff of a small upper over a large
// lower with the reference tree walk over the flattened trees.
func BenchmarkChanges(b *testing.B) {
	plain, _ := benchLayer(b, 2000, 2)
	base := b.TempDir()
	lower, upper := filepath.Join(base, "lower"), filepath.Join(base, "upper")
	flatNew := filepath.Join(base, "new")
	mkdirs(b, lower, upper)
	mustApply(b, lower, plain, ApplyOptions{})
	change := mkTar(b, dir("dir000/", 0o700), reg("dir000/new", "new", 0o644), reg("dir001/.wh.file00001", "", 0o600))
	mustApply(b, upper, change, ApplyOptions{Lowers: []string{lower}})
	flatten(b, flatNew, lower, upper)
	b.Run("native", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := Changes(context.Background(), upper, []string{lower}, ExportOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("tree", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := TreeChanges(context.Background(), lower, flatNew); err != nil {
				b.Fatal(err)
			}
		}
	})
}
