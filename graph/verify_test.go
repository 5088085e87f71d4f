package graph

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ovlkit/ovlkit/layer"
	"golang.org/x/sys/unix"
)

// verifyStore is a store with three applied layers: base, app on base
// (with a whiteout and an opaque directory) and other, a sibling of app,
// plus an empty container layer on app.
type verifyStore struct {
	s    *Store
	tars map[string][]byte
}

func baseTar(t *testing.T) []byte {
	rng := rand.New(rand.NewSource(1))
	big := make([]byte, 3<<20+123)
	rng.Read(big)
	return tarOf(t,
		dir("etc/"), reg("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
		tar.Header{Name: "etc/shadow", Typeflag: tar.TypeReg, Linkname: "root:*:1::::::\n", Mode: 0o640, Gid: 42},
		dir("bin/"), tar.Header{Name: "bin/sh", Typeflag: tar.TypeReg, Linkname: string(big), Mode: 0o755},
		tar.Header{Name: "bin/ash", Typeflag: tar.TypeLink, Linkname: "bin/sh"},
		tar.Header{Name: "bin/sudo", Typeflag: tar.TypeReg, Linkname: "#!", Mode: 0o4755,
			PAXRecords: map[string]string{"SCHILY.xattr.trusted.ovlkit-test": "cap"}},
		reg("empty", ""),
		tar.Header{Name: "lib", Typeflag: tar.TypeSymlink, Linkname: "usr/lib"},
		dir("usr/"), dir("usr/lib/"), reg("usr/lib/libc.so", strings.Repeat("libc", 3000)),
		dir("dev/"), tar.Header{Name: "dev/null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o666},
		tar.Header{Name: "dev/fifo", Typeflag: tar.TypeFifo, Mode: 0o600},
		dir("var/"), dir("var/cache/"), reg("var/cache/x", "x"), reg("var/keep", "k"),
	).Bytes()
}

func newVerifyStore(t *testing.T, layout Layout) *verifyStore {
	t.Helper()
	v := &verifyStore{s: openTest(t, t.TempDir(), layout), tars: map[string][]byte{}}
	v.tars["base"] = baseTar(t)
	v.tars["app"] = tarOf(t, reg("etc/app.conf", "on\n"), reg("etc/.wh.shadow", ""),
		dir("var/cache/"), reg("var/cache/.wh..wh..opq", ""), reg("var/cache/y", "y")).Bytes()
	v.tars["other"] = tarOf(t, reg("other", "other layer")).Bytes()
	for _, c := range []struct{ id, parent string }{{"base", ""}, {"app", "base"}, {"other", "base"}} {
		if err := v.s.Create(context.Background(), c.id, c.parent); err != nil {
			t.Fatal(err)
		}
		v.apply(t, c.id)
	}
	if err := v.s.CreateReadWrite(context.Background(), "ctr", "app"); err != nil {
		t.Fatal(err)
	}
	return v
}

func (v *verifyStore) apply(t *testing.T, id string) {
	t.Helper()
	if _, err := v.s.ApplyDiff(context.Background(), id, bytes.NewReader(v.tars[id])); err != nil {
		t.Fatalf("apply %s: %v", id, err)
	}
}

// manifests reads every layer's manifest file.
func (v *verifyStore) manifests(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, id := range []string{"base", "app", "other", "ctr"} {
		b, err := os.ReadFile(filepath.Join(v.s.layerDir(id), manifestName))
		if err != nil {
			t.Fatal(err)
		}
		out[id] = string(b)
	}
	return out
}

func (v *verifyStore) wantStates(t *testing.T, want map[string]LayerState) {
	t.Helper()
	reps, err := v.s.VerifyAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != len(want) {
		t.Errorf("VerifyAll reported %d layers, want %d", len(reps), len(want))
	}
	for _, r := range reps {
		if r.State != want[r.Layer] {
			t.Errorf("%s: state %s, want %s; damage: %v", r.Layer, r.State, want[r.Layer], r.Damage)
		}
	}
}

func (v *verifyStore) checkClean(t *testing.T) {
	t.Helper()
	probs, err := v.s.Check()
	if err != nil {
		t.Fatal(err)
	}
	if len(probs) > 0 {
		t.Errorf("check: %s", Summary(probs))
	}
}

var allOK = map[string]LayerState{"base": StateOK, "app": StateOK, "other": StateOK, "ctr": StateEmpty}

func TestVerifyFreshStore(t *testing.T) {
	for _, layout := range []Layout{LayoutOverlay, LayoutHardlink} {
		t.Run(string(layout), func(t *testing.T) {
			v := newVerifyStore(t, layout)
			v.wantStates(t, allOK)
			r, err := v.s.Verify(context.Background(), "base")
			if err != nil {
				t.Fatal(err)
			}
			// / etc etc/passwd etc/shadow bin bin/sh bin/ash bin/sudo
			// empty lib usr usr/lib usr/lib/libc.so dev dev/null
			// dev/fifo var var/cache var/cache/x var/keep
			if r.Entries != 20 {
				t.Errorf("base manifest holds %d records, want 20", r.Entries)
			}
			m := v.manifests(t)["app"]
			for _, want := range []string{"\nc /etc/shadow 0000 0 0 0 0\n", "\nd /var/cache 0755 0 0 trusted.overlay.opaque=y\n"} {
				if !strings.Contains(m, want) {
					t.Errorf("app manifest lacks %q:\n%s", want, m)
				}
			}
			m = v.manifests(t)["base"]
			for _, want := range []string{"\nh /bin/sh /bin/ash\n", "\nf /bin/sudo 4755 0 0 2 sha256:", " trusted.ovlkit-test=cap\n",
				"\nc /dev/null 0666 0 0 1 3\n", "\np /dev/fifo 0600 0 0\n", "\nl /lib 0777 0 0 usr/lib\n", "\nf /etc/shadow 0640 0 42 15 sha256:"} {
				if !strings.Contains(m, want) {
					t.Errorf("base manifest lacks %q:\n%s", want, m)
				}
			}
		})
	}
}

// damage is what power loss does to a file, or what a crash leaves.
type damageCase struct {
	name      string
	layer     string
	do        func(t *testing.T, s *Store)
	kind      DamageKind
	path      string
	what      string
	derivable bool
}

func damageCases() []damageCase {
	diff := func(s *Store, id, p string) string { return filepath.Join(s.diffDir(id), p) }
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	return []damageCase{
		{"truncated", "base", func(t *testing.T, s *Store) { must(t, os.Truncate(diff(s, "base", "etc/passwd"), 0)) },
			DamageContent, "/etc/passwd", "truncated to 0 bytes, the manifest says 30", false},
		{"zero-filled", "base", func(t *testing.T, s *Store) {
			p := diff(s, "base", "usr/lib/libc.so")
			must(t, os.WriteFile(p, make([]byte, 12000), 0o644))
		}, DamageContent, "/usr/lib/libc.so", "zero-filled: all 12000 bytes are zeros", false},
		{"one byte changed", "base", func(t *testing.T, s *Store) {
			f, err := os.OpenFile(diff(s, "base", "bin/sh"), os.O_WRONLY, 0)
			must(t, err)
			_, err = f.WriteAt([]byte{0}, 1<<20)
			must(t, err)
			must(t, f.Close())
		}, DamageContent, "/bin/ash", "content differs", false},
		{"file removed", "base", func(t *testing.T, s *Store) { must(t, os.Remove(diff(s, "base", "var/keep"))) },
			DamageMissing, "/var/keep", "missing (the manifest lists a regular file of 1 bytes)", false},
		{"hard link broken", "base", func(t *testing.T, s *Store) {
			p := diff(s, "base", "bin/sh")
			b, err := os.ReadFile(p)
			must(t, err)
			must(t, os.Remove(p))
			must(t, os.WriteFile(p, b, 0o755))
		}, DamageType, "/bin/sh", "no longer the same file as /bin/ash", false},
		{"mode flipped", "app", func(t *testing.T, s *Store) { must(t, os.Chmod(diff(s, "app", "etc/app.conf"), 0o600)) },
			DamageMetadata, "/etc/app.conf", "mode 0600, the manifest says 0644", false},
		{"opaque marker lost", "app", func(t *testing.T, s *Store) {
			must(t, unix.Lremovexattr(diff(s, "app", "var/cache"), "trusted.overlay.opaque"))
		}, DamageMetadata, "/var/cache", "xattr trusted.overlay.opaque is missing", false},
		{"whiteout lost", "app", func(t *testing.T, s *Store) { must(t, os.Remove(diff(s, "app", "etc/shadow"))) },
			DamageMissing, "/etc/shadow", "missing (the manifest lists a whiteout)", false},
		{"stray file", "other", func(t *testing.T, s *Store) { must(t, os.WriteFile(diff(s, "other", "junk"), nil, 0o644)) },
			DamageUnexpected, "/junk", "not in the manifest (a regular file of 0 bytes)", false},
		{"manifest deleted", "app", func(t *testing.T, s *Store) {
			must(t, os.Remove(filepath.Join(s.layerDir("app"), manifestName)))
		}, DamageManifest, "", "bad manifest: missing", false},
		{"manifest torn", "base", func(t *testing.T, s *Store) {
			p := filepath.Join(s.layerDir("base"), manifestName)
			b, err := os.ReadFile(p)
			must(t, err)
			must(t, os.WriteFile(p, b[:len(b)/2], 0o600))
		}, DamageManifest, "", "cut short", false},
		{"manifest zeroed", "other", func(t *testing.T, s *Store) {
			p := filepath.Join(s.layerDir("other"), manifestName)
			fi, err := os.Stat(p)
			must(t, err)
			must(t, os.WriteFile(p, make([]byte, fi.Size()), 0o600))
		}, DamageManifest, "", "not a manifest", false},
		{"diff gone", "other", func(t *testing.T, s *Store) { must(t, os.RemoveAll(s.diffDir("other"))) },
			DamageStructure, "", "diff/ is missing", false},
		{"layer directory gone", "other", func(t *testing.T, s *Store) { must(t, os.RemoveAll(s.layerDir("other"))) },
			DamageStructure, "", "layer directory layers/other is missing", false},
		{"short link removed", "app", func(t *testing.T, s *Store) {
			must(t, os.Remove(s.linkPath(linkOf(t, s, "app"))))
		}, DamageLink, "", "short link l/", true},
		{"short link broken", "base", func(t *testing.T, s *Store) {
			p := s.linkPath(linkOf(t, s, "base"))
			must(t, os.Remove(p))
			must(t, os.Symlink("../layers/other/diff", p))
		}, DamageLink, "", `points to "../layers/other/diff"`, true},
		{"work gone", "app", func(t *testing.T, s *Store) { must(t, os.RemoveAll(s.workDir("app"))) },
			DamageStructure, "", "work/ is missing", true},
		{"depth wrong", "app", func(t *testing.T, s *Store) {
			must(t, s.update(context.Background(), func(st *state) (bool, error) { st.Layers["app"].Depth = 7; return true, nil }))
		}, DamageRecord, "", "recorded depth 7, its chain makes it 2", true},
		{"empty layer's manifest lost", "ctr", func(t *testing.T, s *Store) {
			must(t, os.Remove(filepath.Join(s.layerDir("ctr"), manifestName)))
		}, DamageManifest, "", "missing", true},
	}
}

func linkOf(t *testing.T, s *Store, id string) string {
	t.Helper()
	li, err := s.Layer(id)
	if err != nil {
		t.Fatal(err)
	}
	return li.Link
}

// TestVerifyFindsDamageRepairRestores damages one layer at a time the
// ways a cut leaves it, and shows that Verify names each damage, Repair
// leaves a store that Check finds clean, and applying the same tar again
// gives back exactly the layer the manifest described, while every other
// layer is untouched.
func TestVerifyFindsDamageRepairRestores(t *testing.T) {
	ctx := context.Background()
	for _, layout := range []Layout{LayoutOverlay, LayoutHardlink} {
		for _, c := range damageCases() {
			t.Run(string(layout)+"/"+c.name, func(t *testing.T) {
				v := newVerifyStore(t, layout)
				before := v.manifests(t)
				c.do(t, v.s)
				r, err := v.s.Verify(ctx, c.layer)
				if err != nil {
					t.Fatal(err)
				}
				if r.State != StateDamaged {
					t.Fatalf("state %s, want damaged", r.State)
				}
				found := false
				for _, d := range r.Damage {
					if d.Kind == c.kind && d.Path == c.path && strings.Contains(d.What, c.what) && d.Derivable == c.derivable {
						found = true
					}
				}
				if !found {
					t.Fatalf("damage %v, want %s %q %q (derivable %v)", r.Damage, c.kind, c.path, c.what, c.derivable)
				}
				if len(r.Damage) != 1 {
					t.Errorf("%d damages, want 1: %v", len(r.Damage), r.Damage)
				}
				if r.Derivable() != c.derivable {
					t.Errorf("report derivable %v", r.Derivable())
				}
				// The others are untouched.
				want := map[string]LayerState{}
				for id, st := range allOK {
					want[id] = st
				}
				want[c.layer] = StateDamaged
				v.wantStates(t, want)

				if layout == LayoutHardlink && c.layer != "other" && !c.derivable {
					// Its children's trees share its files.
					if _, err := v.s.Repair(ctx, c.layer); !errors.Is(err, ErrHasChildren) {
						t.Fatalf("repair of a hardlink layer with children: %v, want ErrHasChildren", err)
					}
					return
				}
				r, err = v.s.Repair(ctx, c.layer)
				if err != nil {
					t.Fatalf("repair: %v", err)
				}
				v.checkClean(t)
				if c.derivable {
					if r.State != allOK[c.layer] {
						t.Fatalf("after repair: %s %v, want %s", r.State, r.Damage, allOK[c.layer])
					}
				} else {
					v.wantReset(t, c.layer)
					v.apply(t, c.layer)
				}
				v.wantStates(t, allOK)
				v.checkClean(t)
				if after := v.manifests(t); after[c.layer] != before[c.layer] && c.layer != "ctr" {
					t.Errorf("manifest after repair and re-apply differs:\n%s\nwas\n%s", after[c.layer], before[c.layer])
				}
			})
		}
	}
}

// wantReset checks a layer Repair reset: state needs-apply, empty, and
// it and its descendants refused for use until applied.
func (v *verifyStore) wantReset(t *testing.T, id string) {
	t.Helper()
	ctx := context.Background()
	r, err := v.s.Verify(ctx, id)
	if err != nil || r.State != StateNeedsApply {
		t.Fatalf("after repair: %s %v %v, want needs-apply", r.State, r.Damage, err)
	}
	li, err := v.s.Layer(id)
	if err != nil || !li.NeedsApply || li.Applied || li.Size != 0 {
		t.Errorf("reset layer info %+v %v", li, err)
	}
	if empty, err := dirEmpty(v.s.diffDir(id)); err != nil || !empty {
		t.Errorf("reset layer's diff not empty: %v", err)
	}
	for _, use := range []struct {
		name string
		f    func(id string) error
	}{
		{"get", func(id string) error { _, err := v.s.Get(context.Background(), id); return err }},
		{"diff", func(id string) error { return v.s.Diff(ctx, id, io.Discard) }},
		{"create on", func(id string) error { return v.s.Create(context.Background(), "new-"+id, id) }},
	} {
		for _, target := range []string{id, "ctr"} {
			if target == "ctr" && id == "other" {
				continue // not its descendant
			}
			if err := use.f(target); !errors.Is(err, ErrNeedsApply) {
				t.Errorf("%s %s with %s reset: %v, want ErrNeedsApply", use.name, target, id, err)
			}
		}
	}
}

// A layer applied before manifests existed is reported as such, and
// Repair leaves it alone.
func TestVerifyNoManifest(t *testing.T) {
	ctx := context.Background()
	v := newVerifyStore(t, LayoutOverlay)
	if err := v.s.update(context.Background(), func(st *state) (bool, error) { st.Layers["app"].Manifest = false; return true, nil }); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(v.s.layerDir("app"), manifestName)); err != nil {
		t.Fatal(err)
	}
	want := map[string]LayerState{"base": StateOK, "app": StateNoManifest, "other": StateOK, "ctr": StateEmpty}
	v.wantStates(t, want)
	v.checkClean(t)
	if r, err := v.s.Repair(ctx, "app"); err != nil || r.State != StateNoManifest {
		t.Errorf("repair of a layer without manifest: %s %v", r.State, err)
	}
	v.wantStates(t, want)
}

// A layer reset by Repair under children is applied again under them,
// and a damaged child of a reset parent waits for its parent.
func TestRepairOrder(t *testing.T) {
	ctx := context.Background()
	v := newVerifyStore(t, LayoutOverlay)
	if err := os.Truncate(filepath.Join(v.s.diffDir("base"), "etc/passwd"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(v.s.diffDir("app"), "etc/app.conf"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := v.s.Repair(ctx, "base"); err != nil {
		t.Fatal(err)
	}
	if _, err := v.s.Repair(ctx, "app"); !errors.Is(err, ErrNeedsApply) {
		t.Errorf("repair of app under a reset base: %v, want ErrNeedsApply", err)
	}
	if _, err := v.s.ApplyDiff(ctx, "app", bytes.NewReader(v.tars["app"])); err == nil {
		t.Error("apply to app, which has content, succeeded")
	}
	v.apply(t, "base")
	if _, err := v.s.Repair(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	v.apply(t, "app")
	v.wantStates(t, allOK)
	v.checkClean(t)
}

func TestManifestCodec(t *testing.T) {
	v := newVerifyStore(t, LayoutOverlay)
	b, err := os.ReadFile(filepath.Join(v.s.layerDir("base"), manifestName))
	if err != nil {
		t.Fatal(err)
	}
	entries, err := decodeManifest(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if got := encodeManifest(entries); !bytes.Equal(got, b) {
		t.Errorf("re-encoded manifest differs:\n%s\nwas\n%s", got, b)
	}
	// Names with every awkward byte survive.
	odd := []mentry{{Type: mDir, Path: "/", Mode: 0o755}, {Type: mFile, Path: "/a b%=\n\xff", Mode: 0o644, Size: 1,
		Digest: formatDigest(layer.DigestSHA256, [32]byte{1}), Xattrs: []xattr{{"user.k=v", []byte("x y\x00")}}}}
	got, err := decodeManifest(bytes.NewReader(encodeManifest(odd)))
	if err != nil || len(got) != 2 || got[1].Path != odd[1].Path || string(got[1].Xattrs[0].Value) != "x y\x00" {
		t.Errorf("odd names: %v %+v", err, got)
	}
	for _, c := range []struct{ name, in, want string }{
		{"empty", "", "ends without its trailer"},
		{"other version", "ovlkit-manifest 2\nend 0 x\n", "version \"2\", this build reads 1"},
		{"no newline", "ovlkit-manifest 1\nend 0", "no newline"},
		{"bad checksum", "ovlkit-manifest 1\nd / 0755 0 0\nend 1 " + strings.Repeat("0", 64) + "\n", "checksum mismatch"},
		{"wrong count", string(encodeManifest(odd[:1]))[:len("ovlkit-manifest 1\nd / 0755 0 0\n")] + "end 2 x\n", "counts 2 records"},
		{"unsorted", "ovlkit-manifest 1\nd / 0755 0 0\nd /b 0755 0 0\nd /a 0755 0 0\n", "sorted"},
		{"orphan", "ovlkit-manifest 1\nd / 0755 0 0\nf /a/b 0644 0 0 0 sha256:" + strings.Repeat("0", 64) + "\n", "parent is not a directory"},
		{"bad digest", "ovlkit-manifest 1\nd / 0755 0 0\nf /a 0644 0 0 0 md5:00\n", "unknown algorithm"},
		{"non-canonical escape", "ovlkit-manifest 1\nd / 0755 0 0\nd /%41 0755 0 0\n", "needs none"},
		{"dangling hard link", "ovlkit-manifest 1\nd / 0755 0 0\nh /b /a\n", "no earlier file record"},
		{"trailing data", string(encodeManifest(nil)) + "x", "after the trailer"},
	} {
		_, err := decodeManifest(strings.NewReader(c.in))
		if err == nil || !errors.Is(err, errManifest) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}

// FuzzManifestDecode: any input is refused with an error or decoded into
// records that encode back to exactly the input.
func FuzzManifestDecode(f *testing.F) {
	f.Add(encodeManifest(nil))
	f.Add(encodeManifest([]mentry{{Type: mDir, Path: "/", Mode: 0o755}, {Type: mFile, Path: "/a", Mode: 0o644, Size: 3,
		Digest: formatDigest(layer.DigestSparseSHA256, [32]byte{2})}, {Type: mHardlink, Path: "/b", Target: "/a"},
		{Type: mChar, Path: "/c", Major: 1, Minor: 3, Xattrs: []xattr{{"trusted.overlay.opaque", []byte("y")}}},
		{Type: mSymlink, Path: "/l", Mode: 0o777, Target: "../%x"}}))
	f.Add([]byte("ovlkit-manifest 1\nd / 0755 0 0\nend 1 00\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := decodeManifest(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, errManifest) {
				t.Fatalf("error %v does not wrap errManifest", err)
			}
			return
		}
		if got := encodeManifest(entries); !bytes.Equal(got, data) {
			t.Fatalf("decoded manifest encodes differently:\n%q\nwas\n%q", got, data)
		}
	})
}

// The digest of a sparse file is read from its data extents and equals
// what Apply computes from the tar's fragments.
func TestFileDigestSparse(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sparse")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	const size = 64<<20 + 5
	for _, off := range []int64{3, 8<<20 + 4090, size - 5} {
		if _, err := f.WriteAt([]byte("data!"), off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	body, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	h := layer.NewSparseHash()
	h.WriteAt(body, 0)
	want := formatDigest(layer.DigestSparseSHA256, h.Sum(size))
	got, zeros, err := fileDigest(context.Background(), p, layer.DigestSparseSHA256)
	if err != nil || got != want || zeros {
		t.Errorf("sparse digest %s (zeros %v, %v), want %s", got, zeros, err, want)
	}
}
