package vm

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Accelerator is how QEMU runs the guest.
type Accelerator string

const (
	TCG Accelerator = "tcg"
	KVM Accelerator = "kvm"
)

func (a Accelerator) qemuArgs() []string {
	if a == KVM {
		return []string{"-accel", "kvm", "-cpu", "host"}
	}
	return []string{"-accel", "tcg"}
}

// DetectAccel picks KVM only when it demonstrably boots a kernel: on nested
// hosts /dev/kvm can exist and its ioctls succeed while every guest hangs in
// decompression. Without virtualisation flags in /proc/cpuinfo the answer is
// TCG at once; otherwise a short probe boot decides. The probe result is
// cached in cacheFile, so only the first run pays for it.
func DetectAccel(ctx context.Context, qemu, kernel, cacheFile string) (Accelerator, string) {
	if b, err := os.ReadFile(cacheFile); err == nil {
		if a := Accelerator(strings.TrimSpace(string(b))); a == TCG || a == KVM {
			return a, "cached probe result"
		}
	}
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
		return TCG, "no usable /dev/kvm"
	} else {
		f.Close()
	}
	if !cpuHasVirt() {
		return TCG, "/proc/cpuinfo has no vmx or svm flag"
	}
	a, why := probeKVM(ctx, qemu, kernel)
	_ = os.WriteFile(cacheFile, []byte(string(a)+"\n"), 0o644)
	return a, why
}

func cpuHasVirt() bool {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "flags") {
			for _, f := range strings.Fields(line) {
				if f == "vmx" || f == "svm" {
					return true
				}
			}
			return false
		}
	}
	return false
}

// probeKVM boots kernel under KVM without an initramfs and waits a few
// seconds for it to print its banner.
func probeKVM(ctx context.Context, qemu, kernel string) (Accelerator, string) {
	ctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu, "-accel", "kvm", "-cpu", "host", "-m", "128",
		"-nographic", "-no-reboot", "-kernel", kernel, "-append", "console=ttyS0 panic=-1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return TCG, fmt.Sprintf("kvm probe: %v", err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return TCG, fmt.Sprintf("kvm probe: %v", err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "Linux version") {
			return KVM, "kvm probe boot reached the kernel banner"
		}
	}
	return TCG, "kvm probe boot did not reach the kernel banner in 8s"
}

// hostTSCkHz is the host's TSC frequency when /proc/cpuinfo states it: a
// CPU flagged constant_tsc and tsc_known_freq has a TSC of fixed,
// firmware-reported rate, and under a hypervisor "cpu MHz" is that rate
// rather than the current clock of a scaling core.
func hostTSCkHz() (int, bool) {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0, false
	}
	return parseTSCkHz(string(b))
}

func parseTSCkHz(cpuinfo string) (int, bool) {
	var mhz float64
	flags := map[string]bool{}
	for _, line := range strings.Split(cpuinfo, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "cpu MHz":
			if mhz == 0 {
				mhz, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
			}
		case "flags":
			if len(flags) == 0 {
				for _, f := range strings.Fields(v) {
					flags[f] = true
				}
			}
		}
	}
	if mhz <= 0 || !flags["constant_tsc"] || !flags["tsc_known_freq"] || !flags["hypervisor"] {
		return 0, false
	}
	return int(mhz*1000 + 0.5), true
}
