//go:build ovlkit_guest

package workdir

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// sharedLayers makes one lower layer with two files and a directory, the
// usual material for whiteouts and directory copy-up.
func sharedLayers(t *testing.T, fs guesttest.FS) (guesttest.Layers, string) {
	t.Helper()
	base := fs.Scratch(t, "")
	l := guesttest.NewLayers(t, base, 1)
	guestfs.WriteFile(t, filepath.Join(l.Lower[0], "f1"), "one")
	guestfs.WriteFile(t, filepath.Join(l.Lower[0], "f2"), "two")
	guestfs.WriteFile(t, filepath.Join(l.Lower[0], "f3"), "three")
	guestfs.MkdirAll(t, filepath.Join(l.Lower[0], "d"))
	return l, base
}

// With index=off a second mount may share upper and work dirs with a
// mounted overlay. The first overlay must keep working after that: it
// stages whiteouts and directory copy-ups in work/work.
func TestSharedWorkdirKeepsFirstMountUsable(t *testing.T) {
	guesttest.Proves(t, subjectSharedWorkdir)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		a, base := sharedLayers(t, fs)
		a.Mount(t, "index=off")

		// A whiteout before the second mount caches the shared
		// whiteout inode of the first mount in work/work.
		if err := os.Remove(filepath.Join(a.Merged, "f1")); err != nil {
			t.Fatalf("unlink f1 before the second mount: %v", err)
		}

		kmsg := guesttest.OpenKmsg(t)
		b := secondMount(t, a, base, "merged-b")
		// overlay/036: the second mount succeeds with index=off.
		b.Mount(t, "index=off")
		kmsg.Expect(t, inUseMsg)

		// Operations of the first mount that stage in the work dir: a
		// whiteout, a directory copy-up, and a rename of a lower file
		// (a copy-up, then a whiteout where the source was).
		if err := os.Remove(filepath.Join(a.Merged, "f2")); err != nil {
			t.Errorf("unlink lower file in the first mount: %v", err)
		}
		if err := os.Mkdir(filepath.Join(a.Merged, "d", "x"), 0o755); err != nil {
			t.Errorf("mkdir in a lower dir (directory copy-up) in the first mount: %v", err)
		}
		if err := os.Rename(filepath.Join(a.Merged, "f3"), filepath.Join(a.Merged, "moved")); err != nil {
			t.Errorf("rename of a lower file in the first mount: %v", err)
		}

		for _, name := range []string{"f1", "f2", "f3"} {
			if _, err := os.Lstat(filepath.Join(a.Merged, name)); !os.IsNotExist(err) {
				t.Errorf("%s after unlink or rename in the first mount: got %v, want ENOENT", name, err)
			}
		}
		if fi, err := os.Stat(filepath.Join(a.Upper, "d", "x")); err != nil || !fi.IsDir() {
			t.Errorf("upper d/x after mkdir in the first mount: %v", err)
		}

		// The second mount works too, on the same upper dir.
		guestfs.WriteFile(t, filepath.Join(b.Merged, "from-b"), "b")
		if _, err := os.Stat(filepath.Join(a.Upper, "from-b")); err != nil {
			t.Errorf("file created in the second mount is not in upper: %v", err)
		}
		if err := os.Mkdir(filepath.Join(b.Merged, "d", "y"), 0o755); err != nil {
			t.Errorf("mkdir in the second mount: %v", err)
		}
	})
}

// A volatile overlay records itself in work/work/incompat. Joining it must
// still fail, now that the second mount no longer cleans the work dir
// (where that error used to come from).
func TestSharedWorkdirRefusesVolatile(t *testing.T) {
	guesttest.Keeps(t, "joining a volatile mount is refused with EINVAL")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		a, base := sharedLayers(t, fs)
		a.Mount(t, "index=off", "volatile")

		kmsg := guesttest.OpenKmsg(t)
		b := secondMount(t, a, base, "merged-b")
		err := b.TryMount(t, "index=off")
		if errnoOf(err) != unix.EINVAL {
			t.Fatalf("second mount joining a volatile overlay: got %v, want EINVAL", err)
		}
		kmsg.Expect(t, "incompat feature 'volatile'")

		// The volatile overlay is untouched and keeps working.
		if err := os.Remove(filepath.Join(a.Merged, "f1")); err != nil {
			t.Errorf("unlink in the volatile overlay: %v", err)
		}
		if err := os.Mkdir(filepath.Join(a.Merged, "d", "x"), 0o755); err != nil {
			t.Errorf("directory copy-up in the volatile overlay: %v", err)
		}
	})
}

// With index=on the upper and work dirs are exclusive, as before.
func TestSharedWorkdirIndexOnBusy(t *testing.T) {
	guesttest.Keeps(t, "index=on refuses a shared upper or work dir with EBUSY")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		a, base := sharedLayers(t, fs)
		a.Mount(t, "index=off")

		kmsg := guesttest.OpenKmsg(t)
		b := secondMount(t, a, base, "merged-b")
		err := b.TryMount(t, "index=on")
		if errnoOf(err) != unix.EBUSY {
			t.Fatalf("second mount with index=on: got %v, want EBUSY", err)
		}
		kmsg.Expect(t, inUseMsg)

		if err := os.Remove(filepath.Join(a.Merged, "f1")); err != nil {
			t.Errorf("unlink in the first mount: %v", err)
		}
	})
}

// A mount that joined a shared work dir must survive the departure of the
// mount that set the work dir up: once A is gone, the next mount C must
// see that B still uses the work dir and join it, not clean it as if it
// were the first. (v1 of the series decided this by the in-use lock, which
// A released at unmount, so C cleaned work/ under B.)
func TestSharedWorkdirHandover(t *testing.T) {
	guesttest.Proves(t, subjectSharedWorkdir)
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		a, base := sharedLayers(t, fs)
		guestfs.MkdirAll(t, filepath.Join(a.Lower[0], "e"))
		guestfs.MkdirAll(t, filepath.Join(a.Lower[0], "g"))
		a.Mount(t, "index=off")

		kmsg := guesttest.OpenKmsg(t)
		b := secondMount(t, a, base, "merged-b")
		b.Mount(t, "index=off")
		kmsg.Expect(t, inUseMsg)

		a.Unmount(t)

		c := secondMount(t, a, base, "merged-c")
		c.Mount(t, "index=off")

		// Both operations stage in work/work: the whiteout of the unlink
		// and the new directory of the copy-up are made there and renamed
		// into the upper dir.
		if err := os.Remove(filepath.Join(b.Merged, "f1")); err != nil {
			t.Errorf("unlink of a lower file in B after C mounted: %v", err)
		}
		if err := os.WriteFile(filepath.Join(b.Merged, "d", "new"), []byte("b"), 0o644); err != nil {
			t.Errorf("create in a lower dir (directory copy-up) in B after C mounted: %v", err)
		}
		if err := os.Chmod(filepath.Join(b.Merged, "e"), 0o700); err != nil {
			t.Errorf("chmod of a lower dir (directory copy-up) in B after C mounted: %v", err)
		}
		if _, err := os.Lstat(filepath.Join(b.Merged, "f1")); !os.IsNotExist(err) {
			t.Errorf("f1 after unlink in B: got %v, want ENOENT", err)
		}
		if data, err := os.ReadFile(filepath.Join(a.Upper, "d", "new")); err != nil || string(data) != "b" {
			t.Errorf("d/new in upper after create in B: %q, %v", data, err)
		}
		if fi, err := os.Stat(filepath.Join(a.Upper, "e")); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("e in upper after chmod in B: %v, %v", fi, err)
		}

		// C works on the same dirs as well.
		if err := os.Remove(filepath.Join(c.Merged, "f2")); err != nil {
			t.Errorf("unlink of a lower file in C: %v", err)
		}
		if err := os.Mkdir(filepath.Join(c.Merged, "g", "from-c"), 0o755); err != nil {
			t.Errorf("mkdir in a lower dir (directory copy-up) in C: %v", err)
		}
	})
}

// A volatile overlay works and syncfs on it succeeds; it leaves
// work/work/incompat/volatile behind, and the next mount of the same
// upper/work dirs fails with EINVAL until that directory is removed.
func TestVolatileMountWorks(t *testing.T) {
	guesttest.Keeps(t, "volatile mount, syncfs, and the EINVAL of the next mount until work/incompat is removed")
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		l, _ := sharedLayers(t, fs)
		l.Mount(t, "index=off", "volatile")
		guestfs.WriteFile(t, filepath.Join(l.Merged, "new"), "volatile")
		if err := os.Remove(filepath.Join(l.Merged, "f1")); err != nil {
			t.Errorf("unlink in the volatile mount: %v", err)
		}
		if err := os.Mkdir(filepath.Join(l.Merged, "d", "x"), 0o755); err != nil {
			t.Errorf("directory copy-up in the volatile mount: %v", err)
		}
		f, err := os.Open(l.Merged)
		if err != nil {
			t.Fatalf("open the volatile mount: %v", err)
		}
		err = unix.Syncfs(int(f.Fd()))
		f.Close()
		if err != nil {
			t.Errorf("syncfs on the volatile mount: %v", err)
		}
		l.Unmount(t)

		incompat := filepath.Join(l.Work, "work", "incompat")
		if _, err := os.Stat(filepath.Join(incompat, "volatile")); err != nil {
			t.Errorf("volatile marker after unmount: %v", err)
		}
		kmsg := guesttest.OpenKmsg(t)
		err = l.TryMount(t, "index=off")
		if errnoOf(err) != unix.EINVAL {
			t.Fatalf("plain mount after a volatile one: got %v, want EINVAL", err)
		}
		kmsg.Expect(t, "incompat feature 'volatile'")

		if err := os.RemoveAll(incompat); err != nil {
			t.Fatalf("remove work/work/incompat: %v", err)
		}
		l.Mount(t, "index=off")
		if b, err := os.ReadFile(filepath.Join(l.Merged, "new")); err != nil || string(b) != "volatile" {
			t.Errorf("file written in the volatile mount: %q, %v", b, err)
		}
		for _, name := range []string{"f1", "d/x"} {
			want := name == "d/x"
			_, err := os.Lstat(filepath.Join(l.Merged, name))
			if got := err == nil; got != want {
				t.Errorf("%s after the volatile mount: exists=%v (%v), want %v", name, got, err, want)
			}
		}
	})
}
