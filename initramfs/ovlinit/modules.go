package main

import (
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ovlkit/ovlkit/vm/guestproto"
)

// initFlags are finit_module's flags for a module file: a compressed one
// is unpacked by the kernel (the host packs it compressed only when the
// kernel can, MODULE_DECOMPRESS).
func initFlags(file string) int {
	for _, s := range []string{".xz", ".zst", ".gz"} {
		if strings.HasSuffix(file, s) {
			return unix.MODULE_INIT_COMPRESSED_FILE
		}
	}
	return 0
}

// loadModules loads the packed modules in the host's order, before
// anything else: on such a kernel the results console, the disks and
// overlayfs itself are modules. It returns one problem per module that
// failed; the host fails the run on them once the results console exists
// to send them. A module that reports no device for it (ENODEV: a
// CPU-accelerated checksum without the CPU feature, as under TCG) is
// noted on the console only, as modprobe would report it and go on.
func loadModules() []string {
	b, err := os.ReadFile("/" + guestproto.ModuleOrderPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil // a kernel with everything built in
	}
	if err != nil {
		return []string{fmt.Sprintf("modules: %v", err)}
	}
	mods, err := guestproto.ParseModuleOrder(string(b))
	if err != nil {
		return []string{fmt.Sprintf("modules: %v", err)}
	}
	start := time.Now()
	var problems []string
	loaded := 0
	for _, m := range mods {
		err := finitModule(filepath.Join("/", guestproto.ModulesDir, m.File))
		switch {
		case err == nil:
			loaded++
		case errors.Is(err, unix.EEXIST):
			// Already there (a dependency loaded it, or it is built in).
		case errors.Is(err, unix.ENODEV):
			log.Printf("module %s: %v (no device for it; skipped)", m.Name, err)
		default:
			problems = append(problems, fmt.Sprintf("module %s (%s) failed to load: %v", m.Name, m.File, err))
			log.Printf("module %s: %v", m.Name, err)
		}
	}
	log.Printf("loaded %d of %d modules in %.1fs", loaded, len(mods), time.Since(start).Seconds())
	return problems
}

func finitModule(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.FinitModule(fd, "", initFlags(path))
}
