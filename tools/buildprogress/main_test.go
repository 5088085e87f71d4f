package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestObjectLine(t *testing.T) {
	for line, want := range map[string]bool{
		"  CC      fs/overlayfs/super.o":      true,
		"  CC [M]  fs/overlayfs/super.o":      true,
		"  AS      arch/x86/entry/entry_64.o": true,
		"  HOSTCC  scripts/basic/fixdep":      false,
		"  AR      fs/overlayfs/built-in.a":   false,
		"  LD      vmlinux.o":                 false,
		"  CC      scripts/mod/empty.o extra": false,
		"fs/overlayfs/super.c:12: warning: x": false,
	} {
		if got := objectLine.MatchString(line); got != want {
			t.Errorf("objectLine(%q) = %v, want %v", line, got, want)
		}
	}
}

func TestProgressString(t *testing.T) {
	for _, tc := range []struct {
		p    progress
		want string
	}{
		{progress{name: "b", done: 7, elapsed: 90 * time.Second}, "b: 7 objects, 1m30s elapsed"},
		{progress{name: "b", expect: 1000, done: 10, elapsed: time.Minute}, "b: 10/1000 objects (1%), 1m0s elapsed"},
		{progress{name: "b", expect: 1000, done: 250, elapsed: 5 * time.Minute}, "b: 250/1000 objects (25%), 5m0s elapsed, about 15m0s left"},
		// More objects than last time (a larger configuration): no
		// estimate, and never 100% before the link is done.
		{progress{name: "b", expect: 100, done: 120, elapsed: time.Minute}, "b: 120/100 objects (99%), 1m0s elapsed"},
	} {
		if got := tc.p.String(); got != tc.want {
			t.Errorf("%+v: got %q, want %q", tc.p, got, tc.want)
		}
	}
}

func TestCopyCounting(t *testing.T) {
	in := strings.Join([]string{
		"  HOSTCC  scripts/basic/fixdep",
		"  CC      init/main.o",
		"  AS      arch/x86/kernel/head_64.o",
		"  AR      init/built-in.a",
		"Kernel: arch/x86/boot/bzImage is ready  (#1)",
	}, "\n") + "\n"
	var log, out bytes.Buffer
	r := &reporter{w: &out, interval: time.Hour, last: time.Now()}
	if err := copyCounting(strings.NewReader(in), &log, progress{name: "build stock", expect: 4}, r, time.Now()); err != nil {
		t.Fatal(err)
	}
	if log.String() != in {
		t.Errorf("log differs from the build output:\n%s", log.String())
	}
	// Not a terminal and the interval not reached: only the final line.
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "build stock: 2/4 objects (50%), ") {
		t.Errorf("progress output = %q, want one final line with 2/4 objects", out.String())
	}
}

func TestReporterTerminalRedrawsInPlace(t *testing.T) {
	var out bytes.Buffer
	r := &reporter{w: &out, tty: true}
	now := time.Now()
	r.update(progress{name: "b", done: 1}, now, false)
	r.update(progress{name: "b", done: 2}, now.Add(10*time.Millisecond), false) // too soon: skipped
	r.update(progress{name: "b", done: 3}, now.Add(2*time.Second), true)
	want := "\r\033[Kb: 1 objects, 0s elapsed\r\033[Kb: 3 objects, 0s elapsed\n"
	if out.String() != want {
		t.Errorf("terminal output = %q, want %q", out.String(), want)
	}
}
