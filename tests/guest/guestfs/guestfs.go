//go:build ovlkit_guest

// Package guestfs is the guest tests' file toolkit: making, writing,
// reading and inspecting files and directories in test layers, each call
// failing the test with the path and the error. Every guest package uses
// it instead of a copy of its own; guesttest holds what is about the
// harness (filesystems, mounts, the kernel log, proofs).
package guestfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"golang.org/x/sys/unix"
)

// Mkdir makes the directory path with exactly mode: Mkdir applies the
// umask, and tests compare modes exactly.
func Mkdir(t testing.TB, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(path, mode); err != nil {
		t.Fatalf("mkdir %s: %v", path, err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatalf("chmod %s: %v", path, err)
	}
}

// MkdirAll makes path and its missing parents, 0755 before the umask.
func MkdirAll(t testing.TB, path string) {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatalf("mkdir %s: %v", path, err)
	}
}

// WriteFile writes content to path, 0644 before the umask, in a
// directory that must exist.
func WriteFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}

// Write writes content to path with exactly mode, making the missing
// parent directories.
func Write(t testing.TB, path, content string, mode os.FileMode) {
	t.Helper()
	MkdirAll(t, filepath.Dir(path))
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatalf("chmod %s: %v", path, err)
	}
}

// ReadFile returns what path holds.
func ReadFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return b
}

// Lstat stats path without following a final symlink.
func Lstat(t testing.TB, path string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatalf("lstat %s: %v", path, err)
	}
	return st
}

// Exists reports whether path is there (a dangling symlink is); an error
// other than ENOENT fails the test rather than reading as absent.
func Exists(t testing.TB, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err == nil {
		return true
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("lstat %s: %v", path, err)
	}
	return false
}

// Names lists the names in dir, sorted: one opendir, readdir and close,
// with no stat of the entries, so only readdir is tested.
func Names(t testing.TB, dir string) []string {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	defer f.Close()
	out, err := f.Readdirnames(-1)
	if err != nil {
		t.Fatalf("readdir %s: %v", dir, err)
	}
	sort.Strings(out)
	return out
}

// fsImmutableFL is FS_IMMUTABLE_FL of linux/fs.h, which x/sys/unix does
// not name: nothing in a file or directory with it can change, not even
// by root.
const fsImmutableFL = 0x00000010

// SetImmutable sets or clears the immutable inode flag of path.
func SetImmutable(t testing.TB, path string, on bool) {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer unix.Close(fd)
	// The kernel reads and writes an int; GETFLAGS fills 32 bits.
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		t.Fatalf("get inode flags of %s: %v", path, err)
	}
	if on {
		flags |= fsImmutableFL
	} else {
		flags &^= fsImmutableFL
	}
	if err := unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags)); err != nil {
		t.Fatalf("set inode flags of %s: %v", path, err)
	}
}
