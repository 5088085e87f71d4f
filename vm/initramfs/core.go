package initramfs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"

	"github.com/u-root/gobusybox/src/pkg/golang"
	"github.com/u-root/mkuimage/uimage"
	"github.com/u-root/uio/llog"
)

// Guest commands built into the core image: u-root's init (PID 1: mounts
// /proc, /sys, /dev, /tmp and starts uinit) and ovlinit (runs the tests).
const (
	uinitPkg = "github.com/ovlkit/ovlkit/initramfs/ovlinit"
	initPkg  = "github.com/u-root/u-root/cmds/core/init"
)

// Core returns the cached u-root core image for this source tree,
// building it when go.mod, go.sum, the guest init or the protocol it
// speaks (vm/guestproto) changed. Building it
// takes ~20 s (gobusybox rewrites the commands, defeating the build cache);
// the result is reproducible, so it is keyed by its inputs' content.
func Core(moduleDir, cacheDir string, logw io.Writer) (string, error) {
	key, err := hashInputs(moduleDir, "go.mod", "go.sum", "initramfs", filepath.Join("vm", "guestproto"))
	if err != nil {
		return "", fmt.Errorf("hash initramfs inputs: %w", err)
	}
	out := filepath.Join(cacheDir, "initramfs-"+key[:16]+".cpio")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(cacheDir, "initramfs-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	l := llog.New(slog.LevelWarn, func(format string, args ...any) {
		fmt.Fprintf(logw, "mkuimage: "+format+"\n", args...)
	})
	partial := filepath.Join(tmp, "initramfs.cpio")
	err = uimage.Create(l,
		uimage.WithEnv(
			golang.DisableCGO(),
			golang.WithGOARCH("amd64"),
			golang.WithWorkingDir(moduleDir),
		),
		uimage.WithBusyboxCommands(initPkg, uinitPkg),
		uimage.WithInit("init"),
		uimage.WithUinit("ovlinit"),
		uimage.WithTempDir(tmp),
		uimage.WithCPIOOutput(partial),
	)
	if err != nil {
		return "", fmt.Errorf("build u-root initramfs: %w", err)
	}
	if err := os.Rename(partial, out); err != nil {
		return "", err
	}
	return out, nil
}

// hashInputs hashes the named files and directory trees under root.
func hashInputs(root string, names ...string) (string, error) {
	h := sha256.New()
	for _, n := range names {
		var files []string
		err := filepath.WalkDir(filepath.Join(root, n), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() {
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			return "", err
		}
		sort.Strings(files)
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				return "", err
			}
			rel, _ := filepath.Rel(root, f)
			fmt.Fprintf(h, "%s %d\n", rel, len(b))
			h.Write(b)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
