package experiments

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// CopyTree copies the tree src to dst (which must not exist) as a plain
// copy: new inodes, the data read and written (no hard links or clones:
// io.Copy's copy_file_range makes a real copy on ext4, where the
// experiments use it), modes kept; symlinks, FIFOs and device nodes
// (overlay whiteouts) recreated.
func CopyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := info.Mode()
		switch {
		case mode.IsDir():
			if err := os.Mkdir(target, mode.Perm()); err != nil {
				return fmt.Errorf("copy tree: %w", err)
			}
		case mode.IsRegular():
			if err := copyFile(path, target, mode.Perm()); err != nil {
				return err
			}
		case mode&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return fmt.Errorf("copy tree: %w", err)
			}
			if err := os.Symlink(link, target); err != nil {
				return fmt.Errorf("copy tree: %w", err)
			}
		case mode&(fs.ModeDevice|fs.ModeNamedPipe) != 0:
			st, ok := info.Sys().(*syscall.Stat_t)
			if !ok {
				return fmt.Errorf("copy tree: %s: no device number", path)
			}
			if err := unix.Mknod(target, st.Mode, int(st.Rdev)); err != nil {
				return fmt.Errorf("copy tree: mknod %s: %w", target, err)
			}
		default:
			return fmt.Errorf("copy tree: %s: unsupported file type %v", path, mode.Type())
		}
		return nil
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy tree: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("copy tree: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy tree: %s: %w", dst, err)
	}
	return out.Close()
}

// ReadTree reads every regular file under root to the end and returns
// the bytes read and the number of files.
func ReadTree(root string) (int64, int, error) {
	var total int64
	files := 0
	buf := make([]byte, 1<<20)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, buf)
		if err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
		total += n
		files++
		return nil
	})
	return total, files, err
}

// Meminfo parses /proc/meminfo text into bytes per field.
func Meminfo(text []byte) (map[string]int64, error) {
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			return nil, fmt.Errorf("meminfo line %q: no colon", sc.Text())
		}
		f := strings.Fields(rest)
		if len(f) == 0 || len(f) > 2 || (len(f) == 2 && f[1] != "kB") {
			return nil, fmt.Errorf("meminfo line %q: want a number and kB", sc.Text())
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("meminfo line %q: %w", sc.Text(), err)
		}
		if len(f) == 2 {
			v *= 1024
		}
		out[name] = v
	}
	if len(out) == 0 {
		return nil, errors.New("meminfo: no fields")
	}
	return out, nil
}

// Cached returns the Cached field of /proc/meminfo in bytes.
func Cached() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	m, err := Meminfo(b)
	if err != nil {
		return 0, err
	}
	v, ok := m["Cached"]
	if !ok {
		return 0, errors.New("meminfo has no Cached")
	}
	return v, nil
}

// Resident returns how many of the pages of the file at path are in the
// page cache, and how many pages it has, by mincore(2) on a shared
// read-only mapping (which does not read anything in).
func Resident(path string) (resident, pages int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	if st.Size() == 0 {
		return 0, 0, nil
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, 0, fmt.Errorf("mmap %s: %w", path, err)
	}
	defer unix.Munmap(mem)
	ps := os.Getpagesize()
	vec := make([]byte, (len(mem)+ps-1)/ps)
	// golang.org/x/sys/unix has no wrapper for mincore(2).
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		return 0, 0, fmt.Errorf("mincore %s: %w", path, errno)
	}
	for _, v := range vec {
		if v&1 != 0 {
			resident++
		}
	}
	return resident, len(vec), nil
}

// InodesUsed returns the inodes in use on the filesystem holding path.
func InodesUsed(path string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	return st.Files - st.Ffree, nil
}

// WriteRandomFile writes size bytes of x's stream to a new file.
func WriteRandomFile(path string, size int64, x *Xorshift) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	buf := make([]byte, min(size, 1<<20))
	for left := size; left > 0; {
		n := min(left, int64(len(buf)))
		x.Fill(buf[:n])
		if _, err := f.Write(buf[:n]); err != nil {
			f.Close()
			return fmt.Errorf("write %s: %w", path, err)
		}
		left -= n
	}
	return f.Close()
}

// Xorshift is a fast generator of incompressible file content.
type Xorshift uint64

// Fill fills b with pseudo-random bytes.
func (x *Xorshift) Fill(b []byte) {
	for i := 0; i < len(b); i += 8 {
		v := uint64(*x)
		v ^= v << 13
		v ^= v >> 7
		v ^= v << 17
		*x = Xorshift(v)
		for j := 0; j < 8 && i+j < len(b); j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
}
