//go:build ovlkit_guest

// Package semantics checks the overlayfs behaviour everything else in
// ovlkit relies on — copy-up, whiteouts, opaque directories, redirects,
// hard links and merged readdir — on every upper filesystem. It must pass
// on the stock and the patched kernel alike.
package semantics

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

func getxattr(path, name string) (string, error) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(path, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

func TestMountShowsLayers(t *testing.T) {
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		l := guesttest.NewLayers(t, fs.Scratch(t, ""), 2)
		guestfs.Write(t, l.Lower[0]+"/top", "top", 0o644)
		guestfs.Write(t, l.Lower[1]+"/bottom", "bottom", 0o644)
		l.Mount(t)
		mounts, err := os.ReadFile("/proc/self/mounts")
		if err != nil {
			t.Fatal(err)
		}
		var line string
		for _, m := range strings.Split(string(mounts), "\n") {
			if f := strings.Fields(m); len(f) > 3 && f[1] == l.Merged {
				line = m
			}
		}
		if line == "" {
			t.Fatalf("%s not in /proc/self/mounts", l.Merged)
		}
		for _, want := range []string{" overlay ", "lowerdir=" + l.Lower[0] + ":" + l.Lower[1], "upperdir=" + l.Upper, "workdir=" + l.Work} {
			if !strings.Contains(line, want) {
				t.Errorf("mount line %q lacks %q", line, want)
			}
		}
		if got := guestfs.Names(t, l.Merged); strings.Join(got, ",") != "bottom,top" {
			t.Errorf("merged root = %v, want [bottom top]", got)
		}
		if !guestfs.Exists(t, l.Work+"/work") {
			t.Errorf("mount did not create %s/work", l.Work)
		}
	})
}

func TestReadDoesNotCopyUp(t *testing.T) {
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
		guestfs.Write(t, l.Lower[0]+"/dir/file", "lower data", 0o644)
		l.Mount(t)
		b, err := os.ReadFile(l.Merged + "/dir/file")
		if err != nil || string(b) != "lower data" {
			t.Fatalf("read merged file = %q, %v", b, err)
		}
		f, err := os.Open(l.Merged + "/dir/file")
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		if guestfs.Exists(t, l.Upper+"/dir/file") {
			t.Errorf("reading copied the file up")
		}
		if guestfs.Exists(t, l.Upper+"/dir") {
			t.Errorf("reading copied the parent directory up")
		}
	})
}

// capV2 is a VFS_CAP_REVISION_2 security.capability value granting
// cap_net_raw (13) as permitted and effective.
func capV2() []byte {
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], 0x02000000|0x1)
	binary.LittleEndian.PutUint32(b[4:], 1<<13)
	return b
}

func TestCopyUpKeepsMetadata(t *testing.T) {
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
		lower := l.Lower[0] + "/f"
		guestfs.Write(t, lower, "lower data", 0o644)
		// chown before chmod: chown clears S_ISUID even for root.
		if err := os.Lchown(lower, 1234, 5678); err != nil {
			t.Fatal(err)
		}
		if err := unix.Chmod(lower, 0o4751); err != nil {
			t.Fatal(err)
		}
		xattrs := map[string][]byte{
			"trusted.ovlkit":      []byte("trusted value"),
			"security.capability": capV2(),
		}
		// tmpfs in 6.1 has no user.* xattrs (they came in 6.6); every disk
		// filesystem must have them.
		if fs.Name != "tmpfs" {
			xattrs["user.ovlkit"] = []byte("user value")
		}
		for k, v := range xattrs {
			if err := unix.Lsetxattr(lower, k, v, 0); err != nil {
				t.Fatalf("setxattr %s on lower: %v", k, err)
			}
		}
		old := time.Date(2020, 2, 3, 4, 5, 6, 789000000, time.UTC)
		if err := os.Chtimes(lower, old, old); err != nil {
			t.Fatal(err)
		}
		lst := guestfs.Lstat(t, lower)
		l.Mount(t)

		// Opening for write copies up without changing data or times.
		f, err := os.OpenFile(l.Merged+"/f", os.O_WRONLY, 0)
		if err != nil {
			t.Fatalf("open for write: %v", err)
		}
		f.Close()
		upper := l.Upper + "/f"
		ust := guestfs.Lstat(t, upper)
		if ust.Mode != lst.Mode {
			t.Errorf("upper mode %o, want %o", ust.Mode, lst.Mode)
		}
		if ust.Uid != 1234 || ust.Gid != 5678 {
			t.Errorf("upper owner %d:%d, want 1234:5678", ust.Uid, ust.Gid)
		}
		if ust.Mtim != lst.Mtim {
			t.Errorf("upper mtime %v, want %v", ust.Mtim, lst.Mtim)
		}
		if ust.Atim != lst.Atim {
			t.Errorf("upper atime %v, want %v", ust.Atim, lst.Atim)
		}
		for k, v := range xattrs {
			buf := make([]byte, 64)
			n, err := unix.Lgetxattr(upper, k, buf)
			if err != nil {
				t.Errorf("upper lacks %s: %v", k, err)
				continue
			}
			if !bytes.Equal(buf[:n], v) {
				t.Errorf("upper %s = %q, want %q", k, buf[:n], v)
			}
		}
		// Now the data: a write lands in the upper copy only.
		if err := os.WriteFile(l.Merged+"/f", []byte("new data"), 0); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(upper); string(b) != "new data" {
			t.Errorf("upper content %q after write", b)
		}
		if b, _ := os.ReadFile(lower); string(b) != "lower data" {
			t.Errorf("lower content changed to %q", b)
		}
	})
}

func TestUnlinkLeavesWhiteout(t *testing.T) {
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
		guestfs.Write(t, l.Lower[0]+"/gone", "x", 0o644)
		l.Mount(t)
		if err := os.Remove(l.Merged + "/gone"); err != nil {
			t.Fatalf("unlink: %v", err)
		}
		if guestfs.Exists(t, l.Merged+"/gone") {
			t.Error("unlinked file still visible")
		}
		st := guestfs.Lstat(t, l.Upper+"/gone")
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			t.Errorf("upper/gone mode %o rdev %d, want a 0/0 character device", st.Mode, st.Rdev)
		}
		if !guestfs.Exists(t, l.Lower[0]+"/gone") {
			t.Error("unlink removed the lower file")
		}
	})
}

func TestRmdirMkdirMakesOpaqueDir(t *testing.T) {
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
		guestfs.Write(t, l.Lower[0]+"/d/old", "x", 0o644)
		l.Mount(t)
		if err := os.Remove(l.Merged + "/d/old"); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(l.Merged + "/d"); err != nil {
			t.Fatalf("rmdir: %v", err)
		}
		if err := os.Mkdir(l.Merged+"/d", 0o700); err != nil {
			t.Fatalf("mkdir: %v", err)
		}
		v, err := getxattr(l.Upper+"/d", "trusted.overlay.opaque")
		if err != nil || v != "y" {
			t.Errorf("upper/d trusted.overlay.opaque = %q, %v; want y", v, err)
		}
		if got := guestfs.Names(t, l.Merged+"/d"); len(got) != 0 {
			t.Errorf("new directory shows lower entries %v", got)
		}
	})
}

func TestRenameLowerDir(t *testing.T) {
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		t.Run("redirect_dir=off", func(t *testing.T) {
			l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
			guestfs.Write(t, l.Lower[0]+"/src/f", "x", 0o644)
			l.Mount(t, "redirect_dir=off")
			err := os.Rename(l.Merged+"/src", l.Merged+"/dst")
			if !errors.Is(err, unix.EXDEV) {
				t.Errorf("rename of a lower dir = %v, want EXDEV", err)
			}
		})
		t.Run("redirect_dir=on", func(t *testing.T) {
			l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
			guestfs.Write(t, l.Lower[0]+"/src/f", "content", 0o644)
			l.Mount(t, "redirect_dir=on")
			if err := os.Rename(l.Merged+"/src", l.Merged+"/dst"); err != nil {
				t.Fatalf("rename with redirect_dir=on: %v", err)
			}
			if b, err := os.ReadFile(l.Merged + "/dst/f"); err != nil || string(b) != "content" {
				t.Errorf("dst/f = %q, %v", b, err)
			}
			if guestfs.Exists(t, l.Merged+"/src") {
				t.Error("src still visible after rename")
			}
			v, err := getxattr(l.Upper+"/dst", "trusted.overlay.redirect")
			if err != nil || !strings.Contains(v, "src") {
				t.Errorf("upper/dst trusted.overlay.redirect = %q, %v; want a redirect to src", v, err)
			}
		})
	})
}

func TestHardLinks(t *testing.T) {
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		l := guesttest.NewLayers(t, fs.Scratch(t, ""), 1)
		guestfs.Write(t, l.Lower[0]+"/a", "shared", 0o644)
		l.Mount(t)
		if err := os.Link(l.Merged+"/a", l.Merged+"/b"); err != nil {
			t.Fatalf("link: %v", err)
		}
		sa, sb := guestfs.Lstat(t, l.Merged+"/a"), guestfs.Lstat(t, l.Merged+"/b")
		if sa.Ino != sb.Ino || sa.Nlink != 2 {
			t.Errorf("a ino %d nlink %d, b ino %d: want one inode with two links", sa.Ino, sa.Nlink, sb.Ino)
		}
		if err := os.WriteFile(l.Merged+"/b", []byte("changed"), 0); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(l.Merged + "/a"); string(b) != "changed" {
			t.Errorf("write through b not visible through a: %q", b)
		}
		ua, ub := guestfs.Lstat(t, l.Upper+"/a"), guestfs.Lstat(t, l.Upper+"/b")
		if ua.Ino != ub.Ino {
			t.Error("upper a and b are not one inode")
		}
	})
}

func TestReaddirMergesAndHidesWhiteouts(t *testing.T) {
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		l := guesttest.NewLayers(t, fs.Scratch(t, ""), 2)
		guestfs.Write(t, l.Lower[0]+"/d/top", "x", 0o644)
		guestfs.Write(t, l.Lower[0]+"/d/both", "top version", 0o644)
		guestfs.Write(t, l.Lower[1]+"/d/bottom", "x", 0o644)
		guestfs.Write(t, l.Lower[1]+"/d/both", "bottom version", 0o644)
		guestfs.Write(t, l.Lower[1]+"/d/victim", "x", 0o644)
		l.Mount(t)
		guestfs.Write(t, l.Merged+"/d/new", "x", 0o644)
		if err := os.Remove(l.Merged + "/d/victim"); err != nil {
			t.Fatal(err)
		}
		got := strings.Join(guestfs.Names(t, l.Merged+"/d"), ",")
		if got != "both,bottom,new,top" {
			t.Errorf("merged readdir = %s, want both,bottom,new,top", got)
		}
		if b, _ := os.ReadFile(l.Merged + "/d/both"); string(b) != "top version" {
			t.Errorf("d/both = %q, want the top layer's", b)
		}
		// The whiteout is on disk in the upper, just not listed.
		if st := guestfs.Lstat(t, l.Upper+"/d/victim"); st.Mode&unix.S_IFMT != unix.S_IFCHR {
			t.Errorf("upper/d/victim mode %o, want whiteout", st.Mode)
		}
	})
}
