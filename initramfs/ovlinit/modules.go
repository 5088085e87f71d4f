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
)

// modulesDir holds the modules the host packed for a kernel whose drivers
// are modules, and their load order (vm/modules.go, GuestModulesDir).
const modulesDir = "/ovlkit/modules"

// A module to load: its name and file, from the order file.
type module struct {
	name, file string
}

// readModuleOrder parses the "NAME\tFILE" lines of the order file.
func readModuleOrder(b []byte) ([]module, error) {
	var out []module
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		name, file, ok := strings.Cut(line, "\t")
		if !ok || name == "" || file == "" || strings.Contains(file, "/") {
			return nil, fmt.Errorf("module order line %q: want NAME<tab>FILE", line)
		}
		out = append(out, module{name, file})
	}
	return out, nil
}

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
	b, err := os.ReadFile(filepath.Join(modulesDir, "order"))
	if errors.Is(err, os.ErrNotExist) {
		return nil // a kernel with everything built in
	}
	if err != nil {
		return []string{fmt.Sprintf("modules: %v", err)}
	}
	mods, err := readModuleOrder(b)
	if err != nil {
		return []string{fmt.Sprintf("modules: %v", err)}
	}
	start := time.Now()
	var problems []string
	loaded := 0
	for _, m := range mods {
		err := finitModule(filepath.Join(modulesDir, m.file))
		switch {
		case err == nil:
			loaded++
		case errors.Is(err, unix.EEXIST):
			// Already there (a dependency loaded it, or it is built in).
		case errors.Is(err, unix.ENODEV):
			log.Printf("module %s: %v (no device for it; skipped)", m.name, err)
		default:
			problems = append(problems, fmt.Sprintf("module %s (%s) failed to load: %v", m.name, m.file, err))
			log.Printf("module %s: %v", m.name, err)
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
