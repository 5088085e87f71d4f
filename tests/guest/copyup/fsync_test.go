//go:build ovlkit_guest

package copyup

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/tests/guest/guestfs"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// lowerTree fills the lower layer with what the fsync tests copy up: a
// regular file and a directory, both with a mode and owner a fresh
// temporary file would not have.
func lowerTree(t testing.TB, lower string) {
	t.Helper()
	writeFile(t, filepath.Join(lower, "f"), 64<<10, 0o640)
	chown(t, filepath.Join(lower, "f"), 1234, 5678)
	guestfs.Mkdir(t, filepath.Join(lower, "d"), 0o750)
	chown(t, filepath.Join(lower, "d"), 1234, 5678)
	writeFile(t, filepath.Join(lower, "m"), 4<<10, 0o600)
}

// sameAttrs fails unless the copy up carries the mode and owner of the
// lower inode.
func sameAttrs(t testing.TB, lower, upper string) {
	t.Helper()
	a, b := guestfs.Lstat(t, lower), guestfs.Lstat(t, upper)
	if a.Mode != b.Mode || a.Uid != b.Uid || a.Gid != b.Gid {
		t.Fatalf("copy up %s has mode %o owner %d:%d, lower has mode %o owner %d:%d",
			upper, b.Mode, b.Uid, b.Gid, a.Mode, a.Uid, a.Gid)
	}
}

var xfsSyncEvents = []string{"xfs/xfs_setattr", "xfs/xfs_file_fsync", "xfs/xfs_dir_fsync"}

// TestFsyncOptionValues checks what the fsync= option accepts, how the last
// of several settings wins and what /proc/mounts shows for each.
func TestFsyncOptionValues(t *testing.T) {
	guesttest.Proves(t, subjectFsync)
	tmpfs := guesttest.FS{Name: "tmpfs"}
	good := []struct {
		opts []string
		show string // the fsync= option mountinfo shows, "" for none
		vol  bool   // the mount is volatile
	}{
		{[]string{"fsync=auto"}, "", false},
		{[]string{"fsync=strict"}, "fsync=strict", false},
		{[]string{"fsync=volatile"}, "fsync=volatile", true},
		{[]string{"fsync=strict", "fsync=auto"}, "", false},
		{[]string{"volatile", "fsync=strict"}, "fsync=strict", false},
		{[]string{"fsync=strict", "volatile"}, "fsync=volatile", true},
	}
	for _, c := range good {
		l := guesttest.NewLayers(t, tmpfs.Scratch(t, ""), 1)
		if err := l.TryMount(t, c.opts...); err != nil {
			t.Fatalf("mount with %v: %v", c.opts, err)
		}
		opts := superOptions(t, l.Merged)
		var shown, want []string
		for _, o := range optionSet(opts) {
			if strings.HasPrefix(o, "fsync=") || o == "volatile" {
				shown = append(shown, o)
			}
		}
		if c.show != "" {
			want = []string{c.show}
		}
		if !slices.Equal(shown, want) {
			t.Errorf("mount with %v shows %v in %q, want %v", c.opts, shown, opts, want)
		}
		dirty := guestfs.Exists(t, filepath.Join(l.Work, "work", "incompat", "volatile", "dirty"))
		if dirty != c.vol {
			t.Errorf("mount with %v: volatile dirty marker exists=%v, want %v", c.opts, dirty, c.vol)
		}
	}
	for _, bad := range []string{"fsync=", "fsync=bogus", "fsync=Strict", "fsync", "fsync=auto,fsync=sync"} {
		l := guesttest.NewLayers(t, tmpfs.Scratch(t, ""), 1)
		err := l.TryMount(t, bad)
		if !errors.Is(err, unix.EINVAL) {
			t.Errorf("mount with %q: got %v, want EINVAL", bad, err)
		}
	}
}

// TestFsyncStrictSyncsAfterMetadata proves on an xfs upper that
// fsync=strict syncs a copied up file and directory after their
// attributes were set: xfs_file_fsync (xfs_dir_fsync) of the upper inode
// follows its last xfs_setattr. It also holds for a metadata-only copy up.
func TestFsyncStrictSyncsAfterMetadata(t *testing.T) {
	guesttest.Proves(t, subjectFsync)
	xfs := guesttest.NeedFS(t, "xfs")
	l := splitLayers(t, xfs)
	lowerTree(t, l.Lower[0])
	l.Mount(t, "fsync=strict")
	tr := newTrace(t, xfsSyncEvents...)

	tr.clear(t)
	openForWrite(t, filepath.Join(l.Merged, "f"))
	seq := forInode(tr.events(t), guestfs.Lstat(t, filepath.Join(l.Upper, "f")))
	sync, attr := lastIndex(seq, "xfs_file_fsync"), lastIndex(seq, "xfs_setattr")
	if attr < 0 || sync < attr {
		t.Errorf("regular file copy up: events for the upper inode %v, want xfs_file_fsync after the last xfs_setattr", seq)
	}
	sameAttrs(t, filepath.Join(l.Lower[0], "f"), filepath.Join(l.Upper, "f"))
	sameContent(t, filepath.Join(l.Lower[0], "f"), filepath.Join(l.Upper, "f"))

	tr.clear(t)
	writeFile(t, filepath.Join(l.Merged, "d", "new"), 10, 0o644)
	seq = forInode(tr.events(t), guestfs.Lstat(t, filepath.Join(l.Upper, "d")))
	sync, attr = lastIndex(seq, "xfs_dir_fsync"), lastIndex(seq, "xfs_setattr")
	if attr < 0 || sync < attr {
		t.Errorf("directory copy up: events for the upper inode %v, want xfs_dir_fsync after the last xfs_setattr", seq)
	}
	sameAttrs(t, filepath.Join(l.Lower[0], "d"), filepath.Join(l.Upper, "d"))

	// A metadata-only copy up has no data sync to piggyback on.
	l.Unmount(t)
	l.Mount(t, "fsync=strict", "metacopy=on")
	tr.clear(t)
	if err := os.Chmod(filepath.Join(l.Merged, "m"), 0o604); err != nil {
		t.Fatalf("chmod: %v", err)
	}
	seq = forInode(tr.events(t), guestfs.Lstat(t, filepath.Join(l.Upper, "m")))
	// The chmod itself is the one xfs_setattr after the copy up.
	sync = lastIndex(seq, "xfs_file_fsync")
	if sync < 1 || seq[sync-1] != "xfs_setattr" || !slices.Equal(seq[sync+1:], []string{"xfs_setattr"}) {
		t.Errorf("metadata-only copy up: events for the upper inode %v, want attributes set, xfs_file_fsync, then the chmod's xfs_setattr", seq)
	}
	if st := guestfs.Lstat(t, filepath.Join(l.Upper, "m")); st.Size != 4<<10 || st.Blocks != 0 {
		t.Errorf("metadata-only copy up has size %d and %d blocks, want 4096 and no data", st.Size, st.Blocks)
	}
}

// TestFsyncAutoKeepsDataSync pins the default: the data of a copied up file
// is synced before its attributes are set and directories are not synced.
// This is what every kernel does, so it is no proof of the option.
func TestFsyncAutoKeepsDataSync(t *testing.T) {
	guesttest.Keeps(t, "the default syncs the data of a copy up before its attributes, and no directory")
	xfs := guesttest.NeedFS(t, "xfs")
	l := splitLayers(t, xfs)
	lowerTree(t, l.Lower[0])
	l.Mount(t)
	tr := newTrace(t, xfsSyncEvents...)

	tr.clear(t)
	openForWrite(t, filepath.Join(l.Merged, "f"))
	seq := forInode(tr.events(t), guestfs.Lstat(t, filepath.Join(l.Upper, "f")))
	sync, attr := firstIndex(seq, "xfs_file_fsync"), firstIndex(seq, "xfs_setattr")
	if sync < 0 || attr < sync {
		t.Errorf("regular file copy up: events for the upper inode %v, want one xfs_file_fsync before the attributes are set", seq)
	}

	tr.clear(t)
	writeFile(t, filepath.Join(l.Merged, "d", "new"), 10, 0o644)
	seq = forInode(tr.events(t), guestfs.Lstat(t, filepath.Join(l.Upper, "d")))
	if slices.Contains(seq, "xfs_dir_fsync") {
		t.Errorf("directory copy up synced the directory by default: %v", seq)
	}
	if !slices.Contains(seq, "xfs_setattr") {
		t.Errorf("directory copy up: no xfs_setattr for the upper directory, the trace saw nothing: %v", seq)
	}
}

// TestFsyncStrictBeforeRename proves on an ext4 upper that fsync=strict
// syncs a copied up directory and file while they are still in the work
// directory, i.e. before they are renamed or linked into place.
func TestFsyncStrictBeforeRename(t *testing.T) {
	guesttest.Proves(t, subjectFsync)
	ext4 := guesttest.NeedFS(t, "ext4")
	l := splitLayers(t, ext4)
	lowerTree(t, l.Lower[0])
	l.Mount(t, "fsync=strict")
	work := guestfs.Lstat(t, filepath.Join(l.Work, "work"))
	tr := newTrace(t, "ext4/ext4_sync_file_enter")

	for _, c := range []struct {
		name string
		do   func()
	}{
		{"d", func() { writeFile(t, filepath.Join(l.Merged, "d", "new"), 10, 0o644) }},
		{"f", func() { openForWrite(t, filepath.Join(l.Merged, "f")) }},
	} {
		tr.clear(t)
		c.do()
		st := guestfs.Lstat(t, filepath.Join(l.Upper, c.name))
		var syncs []traceEvent
		for _, e := range named(tr.events(t), "ext4_sync_file_enter") {
			if e.isInode(st) {
				syncs = append(syncs, e)
			}
		}
		if len(syncs) != 1 {
			t.Errorf("copy up of %s: %d ext4_sync_file_enter events for the upper inode, want 1: %v", c.name, len(syncs), syncs)
			continue
		}
		if p := syncs[0].uint(t, "parent"); p != work.Ino {
			t.Errorf("copy up of %s was synced with parent inode %d, want the work directory %d", c.name, p, work.Ino)
		}
		sameAttrs(t, filepath.Join(l.Lower[0], c.name), filepath.Join(l.Upper, c.name))
	}
}

// TestFsyncVolatileAlias proves that fsync=volatile is the volatile option:
// the same mount options shown, the same dirty marker in the work
// directory, and no sync of copied up data.
func TestFsyncVolatileAlias(t *testing.T) {
	guesttest.Proves(t, subjectFsync)
	xfs := guesttest.NeedFS(t, "xfs")
	var shown [][]string
	for _, opt := range []string{"volatile", "fsync=volatile"} {
		l := splitLayers(t, xfs)
		lowerTree(t, l.Lower[0])
		if err := l.TryMount(t, opt); err != nil {
			t.Fatalf("mount with %s: %v", opt, err)
		}
		shown = append(shown, optionSet(superOptions(t, l.Merged)))
		dirty := guestfs.Exists(t, filepath.Join(l.Work, "work", "incompat", "volatile", "dirty"))
		if !dirty {
			t.Errorf("mount with %s made no volatile dirty marker", opt)
		}
		tr := newTrace(t, xfsSyncEvents...)
		tr.clear(t)
		openForWrite(t, filepath.Join(l.Merged, "f"))
		seq := forInode(tr.events(t), guestfs.Lstat(t, filepath.Join(l.Upper, "f")))
		if slices.Contains(seq, "xfs_file_fsync") {
			t.Errorf("mount with %s synced a copy up: %v", opt, seq)
		}
		if !slices.Contains(seq, "xfs_setattr") {
			t.Errorf("mount with %s: no xfs_setattr for the copy up, the trace saw nothing: %v", opt, seq)
		}
		sameContent(t, filepath.Join(l.Lower[0], "f"), filepath.Join(l.Upper, "f"))
	}
	if !slices.Equal(shown[0], shown[1]) {
		t.Errorf("volatile shows options %v, fsync=volatile shows %v", shown[0], shown[1])
	}
	if !slices.Contains(shown[1], "fsync=volatile") {
		t.Errorf("fsync=volatile mount shows %v, want fsync=volatile among them", shown[1])
	}
}

// xfsMetacopyRemoval are the xfs events one of which fires when an xattr
// is removed: in the inode (short form), from a leaf block or from a node
// tree, depending on how many xattrs the inode has.
var xfsMetacopyRemoval = []string{"xfs/xfs_attr_sf_remove", "xfs/xfs_attr_leaf_removename", "xfs/xfs_attr_node_removename"}

// subjectMetacopySync is the 6.12 series' patch that takes the place of
// the 6.1 fsync= patch: 6.12 has fsync= upstream, but syncs nothing around
// the data copy up of a metacopy file under fsync=strict.
const subjectMetacopySync = "ovl: sync the data of a metacopy file before removing its metacopy xattr"

// metacopyOrderSubject is, per kernel base, the patch that makes
// fsync=strict sync a metacopy file's data before removing its metacopy
// xattr.
var metacopyOrderSubject = map[string]string{
	"6.1":  subjectFsync,
	"6.12": subjectMetacopySync,
}

// TestFsyncStrictMetacopyDataOrder proves on an xfs upper that fsync=strict
// persists the data of a metacopy file before it removes the
// trusted.overlay.metacopy xattr, and syncs again after the removal. Removing
// the xattr first would let a crash persist the removal without the data:
// the upper file would then claim to be complete and read as holes. On 6.1
// the fsync= patch does this; on 6.12, which has fsync= upstream, the
// series' own patch for the order does.
func TestFsyncStrictMetacopyDataOrder(t *testing.T) {
	guesttest.Proves(t, guesttest.ForBase(t, metacopyOrderSubject))
	xfs := guesttest.NeedFS(t, "xfs")
	l := splitLayers(t, xfs)
	lowerTree(t, l.Lower[0])
	l.Mount(t, "metacopy=on", "fsync=strict")
	tr := newTrace(t, append([]string{"xfs/xfs_file_fsync"}, xfsMetacopyRemoval...)...)

	// chmod copies m up without data: the upper file carries the
	// metacopy xattr until the data follows.
	if err := os.Chmod(filepath.Join(l.Merged, "m"), 0o604); err != nil {
		t.Fatalf("chmod: %v", err)
	}
	upper := filepath.Join(l.Upper, "m")
	if st := guestfs.Lstat(t, upper); st.Blocks != 0 {
		t.Fatalf("metadata-only copy up of m has %d blocks, want none", st.Blocks)
	}
	if _, err := unix.Lgetxattr(upper, "trusted.overlay.metacopy", nil); err != nil {
		t.Fatalf("metadata-only copy up of m has no trusted.overlay.metacopy: %v", err)
	}

	tr.clear(t)
	openForWrite(t, filepath.Join(l.Merged, "m"))
	st := guestfs.Lstat(t, upper)
	var seq []string
	for _, e := range tr.events(t) {
		if !e.isInode(st) {
			continue
		}
		switch {
		case e.Name == "xfs_file_fsync":
			seq = append(seq, "fsync")
		case e.Fields["name"] == "overlay.metacopy":
			seq = append(seq, "remove metacopy")
		}
	}
	removal := firstIndex(seq, "remove metacopy")
	if removal < 0 {
		t.Fatalf("data copy up of m: no removal of the metacopy xattr traced, events for the upper inode: %v", seq)
	}
	if !slices.Contains(seq[:removal], "fsync") || !slices.Contains(seq[removal+1:], "fsync") {
		t.Errorf("data copy up of m: events for the upper inode %v, want an fsync before the metacopy xattr is removed and one after", seq)
	}

	if _, err := unix.Lgetxattr(upper, "trusted.overlay.metacopy", nil); !errors.Is(err, unix.ENODATA) {
		t.Errorf("trusted.overlay.metacopy after the data copy up: got %v, want ENODATA", err)
	}
	sameContent(t, filepath.Join(l.Lower[0], "m"), upper)
}
