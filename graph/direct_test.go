package graph

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// These tests need no overlay mount: a writable layer without a parent is
// not mounted (see Store.direct). What is mounted is tested in the guest
// (tests/guest/graph).

func TestGetWithoutParentIsTheDiff(t *testing.T) {
	for _, layout := range []Layout{LayoutOverlay, LayoutHardlink} {
		t.Run(string(layout), func(t *testing.T) {
			ctx := context.Background()
			s := openTest(t, t.TempDir(), layout)
			// An image layer is writable without a parent only in the
			// overlay layout; a container layer is in both.
			ids := []string{"ctr"}
			must(t, s.CreateReadWrite(ctx, "ctr", ""))
			if layout == LayoutOverlay {
				must(t, s.Create(ctx, "img", ""))
				ids = append(ids, "img")
			}
			for _, id := range ids {
				p, err := s.Get(ctx, id)
				if err != nil {
					t.Fatalf("get %s: %v", id, err)
				}
				if p != s.diffDir(id) {
					t.Fatalf("get %s: %s, want its diff directory %s", id, p, s.diffDir(id))
				}
				if _, err := os.Lstat(s.mergedDir(id)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("get %s made a mount point: %v", id, err)
				}
				must(t, os.WriteFile(filepath.Join(p, "f"), []byte("x"), 0o644))
				if p2, err := s.Get(ctx, id); err != nil || p2 != p {
					t.Fatalf("second get %s: %s %v", id, p2, err)
				}
				li, err := s.Layer(id)
				if err != nil || li.Mounts != 2 || li.Path != p || li.ReadOnly {
					t.Errorf("layer %s while referenced twice: %+v %v", id, li, err)
				}
				st, err := s.Status()
				if err != nil || len(st.Mounted) != 1 || st.Mounted[0].Path != p || st.Mounted[0].Refs != 2 {
					t.Errorf("status of %s: %+v %v", id, st.Mounted, err)
				}
				if probs, err := s.Check(); err != nil || len(probs) != 0 {
					t.Errorf("check while %s is referenced: %v %v", id, probs, err)
				}
				// Whatever refuses a mounted layer refuses a referenced one.
				if err := s.Remove(ctx, id); !errors.Is(err, ErrMounted) {
					t.Errorf("remove %s while referenced: %v, want ErrMounted", id, err)
				}
				if err := s.CreateReadWrite(ctx, id+"-child", id); !errors.Is(err, ErrMounted) {
					t.Errorf("child of %s while referenced: %v, want ErrMounted", id, err)
				}
				if _, err := s.ApplyDiff(ctx, id, tarOf(t, reg("a", "a"))); !errors.Is(err, ErrMounted) {
					t.Errorf("apply to %s while referenced: %v, want ErrMounted", id, err)
				}
				must(t, s.Put(ctx, id))
				if li, err := s.Layer(id); err != nil || li.Mounts != 1 {
					t.Errorf("layer %s after one of two Puts: %+v %v", id, li, err)
				}
				must(t, s.Put(ctx, id))
				if err := s.Put(ctx, id); !errors.Is(err, ErrNotMounted) {
					t.Errorf("third put of %s: %v, want ErrNotMounted", id, err)
				}
				if b, err := os.ReadFile(filepath.Join(s.diffDir(id), "f")); err != nil || string(b) != "x" {
					t.Errorf("what was written through %s: %q %v", id, b, err)
				}
				must(t, s.Remove(ctx, id))
			}
		})
	}
}

// A reference is the store's, not the process's: another Open (another
// process) sees it and drops it, as with a mount.
func TestDirectReferenceSharedBetweenOpens(t *testing.T) {
	ctx := context.Background()
	home := t.TempDir()
	s1 := openTest(t, home, LayoutOverlay)
	must(t, s1.CreateReadWrite(ctx, "ctr", ""))
	p, err := s1.Get(ctx, "ctr")
	must(t, err)
	s2 := openTest(t, home, LayoutOverlay) // its recovery must keep the count
	if err := s2.Remove(ctx, "ctr"); !errors.Is(err, ErrMounted) {
		t.Errorf("remove through another open: %v, want ErrMounted", err)
	}
	if p2, err := s2.Get(ctx, "ctr"); err != nil || p2 != p {
		t.Errorf("get through another open: %s %v, want %s", p2, err, p)
	}
	must(t, s2.Put(ctx, "ctr"))
	must(t, s1.Put(ctx, "ctr"))
	must(t, s2.Remove(ctx, "ctr"))
}

// A count taken in an earlier boot is stale: Open clears it, and Get
// starts afresh.
func TestDirectReferenceFromEarlierBoot(t *testing.T) {
	ctx := context.Background()
	home := t.TempDir()
	s := openTest(t, home, LayoutOverlay)
	must(t, s.CreateReadWrite(ctx, "a", ""))
	must(t, s.CreateReadWrite(ctx, "b", ""))
	stale := mountRecord{Refs: 3, Dir: true, Boot: "an-earlier-boot"}
	for _, id := range []string{"a", "b"} {
		must(t, unix.Lsetxattr(s.layerDir(id), s.mountsAttr(), stale.encode(), 0))
	}
	if _, err := s.Get(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if li, err := s.Layer("a"); err != nil || li.Mounts != 1 {
		t.Errorf("get over a stale count: %+v %v, want one reference", li, err)
	}
	must(t, s.Put(ctx, "a"))
	if li, err := s.Layer("b"); err != nil || li.Mounts != 0 {
		t.Errorf("stale count reported: %+v %v", li, err)
	}
	openTest(t, home, LayoutOverlay)
	if m, err := s.recordedMounts("b"); err != nil || m.Refs != 0 {
		t.Errorf("open left the stale record %+v %v", m, err)
	}
	must(t, s.Remove(ctx, "b"))
}

// Writing through the handed-out directory changes an applied layer, so
// Get records that before it returns, as for a mount, and Check stops
// comparing the content with the applied size.
func TestDirectGetMarksAppliedLayerWritten(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, t.TempDir(), LayoutOverlay)
	must(t, s.Create(ctx, "base", ""))
	if _, err := s.ApplyDiff(ctx, "base", tarOf(t, reg("a", "abc"))); err != nil {
		t.Fatal(err)
	}
	p, err := s.Get(ctx, "base")
	must(t, err)
	must(t, s.view(ctx, func(st *state) error {
		if !st.Layers["base"].Written {
			t.Error("applied layer not recorded as written after Get")
		}
		return nil
	}))
	must(t, os.WriteFile(filepath.Join(p, "more"), []byte("more content"), 0o644))
	must(t, s.Put(ctx, "base"))
	if probs, err := s.Check(); err != nil || len(probs) != 0 {
		t.Errorf("check after writing through Get: %v %v", probs, err)
	}
}

// A volatile mount (by an earlier version of the store) leaves overlayfs's
// mark in the work directory. Get refuses the layer after a reboot, as the
// kernel refuses to mount it, and within the boot drops the mark.
func TestDirectGetHonoursVolatileMark(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, t.TempDir(), LayoutOverlay)
	for _, c := range []struct {
		id, boot string
		want     error
	}{{"torn", "an-earlier-boot", ErrVolatileLost}, {"fine", s.boot, nil}} {
		must(t, s.CreateReadWrite(ctx, c.id, ""))
		mark := filepath.Join(s.workDir(c.id), "work", "incompat", "volatile")
		must(t, os.MkdirAll(mark, 0o700))
		must(t, unix.Lsetxattr(s.layerDir(c.id), s.xattrName(volatileXattr), []byte(c.boot), 0))
		_, err := s.Get(ctx, c.id)
		if !errors.Is(err, c.want) {
			t.Errorf("get %s: %v, want %v", c.id, err, c.want)
		}
		_, serr := os.Lstat(mark)
		if c.want == nil {
			if !errors.Is(serr, os.ErrNotExist) {
				t.Errorf("%s: mark of this boot kept: %v", c.id, serr)
			}
			must(t, s.Put(ctx, c.id))
		} else if serr != nil {
			t.Errorf("%s: mark of an earlier boot removed: %v", c.id, serr)
		}
	}
}

// Which layers Get hands out without a mount.
func TestDirectOnlyForWritableLayersWithoutParent(t *testing.T) {
	s := openTest(t, t.TempDir(), LayoutOverlay)
	for _, c := range []struct {
		what      string
		r         layerRecord
		ro, userx bool
		boot      string
		want      bool
	}{
		{"writable, no parent", layerRecord{}, false, false, "b", true},
		{"a parent", layerRecord{Parent: "p"}, false, false, "b", false},
		{"a read-only view", layerRecord{Committed: true}, true, false, "b", false},
		{"userxattr store", layerRecord{}, false, true, "b", false},
		{"no boot ID", layerRecord{}, false, false, "", false},
	} {
		s.userx, s.bootTag = c.userx, c.boot
		if got := s.direct(&c.r, c.ro); got != c.want {
			t.Errorf("%s: direct %v, want %v", c.what, got, c.want)
		}
	}
}

func TestMountRecordDirCodec(t *testing.T) {
	m := mountRecord{Refs: 2, Dir: true, Boot: bootTag("Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC 1733300000")}
	if got, err := decodeMountRecord(m.encode()); err != nil || got != m {
		t.Errorf("%+v: round trip gave %+v, %v", m, got, err)
	}
	for _, bad := range []string{"1 dir", "1 dir ", "1 dir a b", "1 ro boot", "1 rw boot", "-1 dir b"} {
		if _, err := decodeMountRecord([]byte(bad)); err == nil {
			t.Errorf("%q: decoded without error", bad)
		}
	}
}
