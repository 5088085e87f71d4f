//go:build ovlkit_guest

package experiments

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/ovl"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// firstWrite opens path for writing, writes 4 KiB at offset 0, fsyncs and
// closes it: through an overlay the open copies the lower file up.
func firstWrite(path string, block []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(block, 0); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeNew writes size bytes to a new file and fsyncs it: what copy-up
// must at least do, the upper filesystem's limit.
func writeNew(path string, size int64, chunk []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	for left := size; left > 0; {
		n := min(left, int64(len(chunk)))
		if _, err := f.Write(chunk[:n]); err != nil {
			f.Close()
			return err
		}
		left -= n
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncfs(tb testing.TB, dir string) {
	tb.Helper()
	f, err := os.Open(dir)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		tb.Fatalf("syncfs %s: %v", dir, err)
	}
}

// copyUpCase is one contender of experiment 3. setup prepares a fresh
// root holding the lower data (from the tar) and returns the directory the
// writes go to and a teardown; counters reads the overlay's copy-up
// counters (nil for the contenders without overlay).
type copyUpCase struct {
	name   string
	fs     string
	direct bool   // write new files instead of the lower ones
	opts   string // overlay options; "" with btrfs means a snapshot
}

// BenchmarkCopyUp is experiment 3: the first write to lower files of
// each size, and to every file of a tree, through an overlay whose lower
// and upper share one ext4 or xfs filesystem (fsync=auto and
// fsync=strict), against writing the same data to new files on that
// filesystem (the limit) and against the first write in a Btrfs snapshot
// (copy-on-write, no copy-up). The overlay's copy-up counters show how
// the data moved: copied on ext4, cloned (reflink) on xfs.
func BenchmarkCopyUp(b *testing.B) {
	describe(b)
	c := loadConfig(b)
	rec := recorder{b, "copyup"}
	var files []tarFile
	for _, size := range c.cuSizes {
		files = append(files, tarFile{name: fmt.Sprintf("file-%d", size), size: size})
	}
	dirs, tree := treeSpec("tree", c.cuTreeFiles, 4096)
	lowerTar := makeTar(b, dirs, append(files, tree...), 3)
	block := make([]byte, 4096)
	chunk := make([]byte, 1<<20)
	x := Xorshift(5)
	x.Fill(chunk)
	copy(block, chunk)

	cases := []copyUpCase{
		{name: "overlay-ext4-auto", fs: "ext4", opts: "fsync=auto"},
		{name: "overlay-ext4-strict", fs: "ext4", opts: "fsync=strict"},
		{name: "direct-ext4", fs: "ext4", direct: true},
		{name: "overlay-xfs-auto", fs: "xfs", opts: "fsync=auto"},
		{name: "overlay-xfs-strict", fs: "xfs", opts: "fsync=strict"},
		{name: "direct-xfs", fs: "xfs", direct: true},
		{name: "btrfs-snapshot", fs: "btrfs"},
	}
	scratch := map[string]string{}
	for _, name := range []string{"ext4", "xfs", "btrfs"} {
		scratch[name] = guesttest.NeedFS(b, name).Scratch(b, "")
	}
	start := time.Now()
	for rep := 0; rep < c.reps; rep++ {
		for _, cc := range cases {
			base := filepath.Join(scratch[cc.fs], fmt.Sprintf("%s-%d", cc.name, rep))
			var target string // where the files are written
			var cleanup func()
			switch {
			case cc.direct:
				target = base
				if err := os.MkdirAll(filepath.Join(target, "tree"), 0o755); err != nil {
					b.Fatal(err)
				}
				for _, d := range dirs {
					if err := os.MkdirAll(filepath.Join(target, d), 0o755); err != nil {
						b.Fatal(err)
					}
				}
				cleanup = func() {}
			case cc.opts == "":
				if err := os.Mkdir(base, 0o755); err != nil {
					b.Fatal(err)
				}
				if err := BtrfsSubvolCreate(base, "lower"); err != nil {
					b.Fatal(err)
				}
				applyTo(b, filepath.Join(base, "lower"), lowerTar)
				if err := BtrfsSnapshot(filepath.Join(base, "lower"), base, "snap"); err != nil {
					b.Fatal(err)
				}
				target = filepath.Join(base, "snap")
				cleanup = func() {
					for _, sv := range []string{"snap", "lower"} {
						if err := BtrfsSubvolDelete(base, sv); err != nil {
							b.Fatal(err)
						}
					}
				}
			default:
				lower := filepath.Join(base, "lower")
				applyTo(b, lower, lowerTar)
				target = filepath.Join(base, "merged")
				mountOverlay(b, lower, filepath.Join(base, "upper"), filepath.Join(base, "work"), target, cc.opts)
				cleanup = func() { unmount(b, target) }
			}
			// Cold lower files, as an image on disk would be.
			dropCaches(b)
			for _, f := range files {
				p := filepath.Join(target, f.name)
				t0 := time.Now()
				var err error
				if cc.direct {
					err = writeNew(p, f.size, chunk)
				} else {
					err = firstWrite(p, block)
				}
				d := time.Since(t0)
				if err != nil {
					b.Fatalf("%s: %s: %v", cc.name, p, err)
				}
				rec.emit(cc.name, float64(f.size), "ms", "ms", rep, ms(d))
				rec.emit(cc.name, float64(f.size), "mb_per_s", "MB/s", rep, float64(f.size)/1e6/d.Seconds())
			}
			t0 := time.Now()
			for _, f := range tree {
				p := filepath.Join(target, f.name)
				var err error
				if cc.direct {
					err = os.WriteFile(p, chunk[:f.size], 0o644)
				} else {
					err = overwrite(p, block)
				}
				if err != nil {
					b.Fatalf("%s: %s: %v", cc.name, p, err)
				}
			}
			syncfs(b, target)
			d := time.Since(t0)
			rec.emit(cc.name+"-tree", float64(len(tree)), "ms", "ms", rep, ms(d))
			rec.emit(cc.name+"-tree", float64(len(tree)), "files_per_s", "files/s", rep, float64(len(tree))/d.Seconds())
			if !cc.direct && cc.opts != "" {
				st, err := ovl.CopyUpStats(target)
				if err != nil {
					b.Fatalf("%s: copy-up counters: %v", cc.name, err)
				}
				for _, k := range []string{"copied_bytes", "cloned_bytes", "fsync", "reg", "dir"} {
					rec.emit(cc.name, 0, k, "", rep, float64(st[k]))
				}
			}
			cleanup()
			if err := os.RemoveAll(base); err != nil {
				b.Fatal(err)
			}
		}
		b.Logf("copy-up repetition %d done after %v", rep, time.Since(start).Round(time.Second))
	}
	traceCopyUp(b, scratch, lowerTar, files[len(files)-1].name, block)
}

// overwrite opens an existing file for writing and writes block at 0,
// without a sync: the tree's files are made durable by one syncfs.
func overwrite(path string, block []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(block, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// traceCopyUp writes one lower file through an overlay on ext4 and on
// xfs with the series' ovl_copy_up_end event enabled, and prints the
// event: method=splice on ext4, method=clone on xfs.
func traceCopyUp(b *testing.B, scratch map[string]string, lowerTar []byte, name string, block []byte) {
	const root = "/sys/kernel/tracing"
	if _, err := os.Stat(filepath.Join(root, "instances")); err != nil {
		if err := unix.Mount("tracefs", root, "tracefs", 0, ""); err != nil {
			b.Fatalf("mount tracefs: %v", err)
		}
	}
	inst := filepath.Join(root, "instances", "ovlkit-experiments")
	if err := os.Mkdir(inst, 0o755); err != nil {
		b.Fatalf("trace instance: %v", err)
	}
	enable := filepath.Join(inst, "events", "overlayfs", "ovl_copy_up_end", "enable")
	defer func() {
		_ = os.WriteFile(enable, []byte("0"), 0)
		if err := unix.Rmdir(inst); err != nil {
			b.Errorf("remove trace instance: %v", err)
		}
	}()
	if err := os.WriteFile(enable, []byte("1"), 0); err != nil {
		b.Fatalf("enable ovl_copy_up_end: %v", err)
	}
	env := Env{}
	for _, fs := range []string{"ext4", "xfs"} {
		base := filepath.Join(scratch[fs], "trace")
		lower := filepath.Join(base, "lower")
		applyTo(b, lower, lowerTar)
		merged := filepath.Join(base, "merged")
		mountOverlay(b, lower, filepath.Join(base, "upper"), filepath.Join(base, "work"), merged, "")
		if err := os.WriteFile(filepath.Join(inst, "trace"), nil, 0); err != nil {
			b.Fatalf("clear trace: %v", err)
		}
		if err := firstWrite(filepath.Join(merged, name), block); err != nil {
			b.Fatal(err)
		}
		out, err := os.ReadFile(filepath.Join(inst, "trace"))
		if err != nil {
			b.Fatal(err)
		}
		var ev string
		for _, l := range strings.Split(string(out), "\n") {
			if i := strings.Index(l, "ovl_copy_up_end:"); i >= 0 {
				ev = strings.TrimSpace(l[i:])
			}
		}
		if ev == "" {
			b.Fatalf("no ovl_copy_up_end event on %s:\n%s", fs, out)
		}
		env["trace_"+fs] = ev
		unmount(b, merged)
		if err := os.RemoveAll(base); err != nil {
			b.Fatal(err)
		}
	}
	if err := EmitEnv(os.Stdout, env); err != nil {
		b.Fatal(err)
	}
}
