package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLockdepDebugLocks(t *testing.T) {
	stats := " lock-classes:                         1624 [max: 8192]\n" +
		" debug_locks:                            0\n" +
		" zapped classes:                         4\n"
	if v, ok := lockdepDebugLocks(stats); !ok || v != 0 {
		t.Errorf("debug_locks = %d, %v; want 0, true", v, ok)
	}
	if v, ok := lockdepDebugLocks(strings.Replace(stats, "      0\n", "      1\n", 1)); !ok || v != 1 {
		t.Errorf("debug_locks = %d, %v; want 1, true", v, ok)
	}
	if _, ok := lockdepDebugLocks(" lock-classes: 3\n"); ok {
		t.Error("found debug_locks in stats without it")
	}
}

func TestTestMarkerNotesRunAndCont(t *testing.T) {
	log, err := os.Create(filepath.Join(t.TempDir(), "kmsg"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	var out bytes.Buffer
	m := &testMarker{w: &out, kmsg: log, pkg: "example/pkg"}
	input := "\x16=== RUN   TestA\n=== RUN   TestA/ext4\n    a_test.go:1: === RUN not at the start\n\x16=== CONT  TestB\n--- PASS: TestA (0.00s)\n\x16=== RUN   TestC"
	// Split writes across line boundaries, as a pipe may deliver them.
	for _, chunk := range []string{input[:7], input[7:40], input[40:]} {
		if _, err := m.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	m.flush()
	if out.String() != input {
		t.Errorf("output changed on the way through:\n%q", out.String())
	}
	got, err := os.ReadFile(log.Name())
	if err != nil {
		t.Fatal(err)
	}
	want := "<14>ovlkit: run example/pkg TestA\n" +
		"<14>ovlkit: run example/pkg TestA/ext4\n" +
		"<14>ovlkit: run example/pkg TestB\n" +
		"<14>ovlkit: run example/pkg TestC\n"
	if string(got) != want {
		t.Errorf("markers:\n%s\nwant:\n%s", got, want)
	}
}

func TestInitFlags(t *testing.T) {
	if initFlags("000-virtio.ko") != 0 || initFlags("001-overlay.ko.xz") == 0 {
		t.Errorf("initFlags: plain %d, xz %d; want 0 and MODULE_INIT_COMPRESSED_FILE", initFlags("000-virtio.ko"), initFlags("001-overlay.ko.xz"))
	}
}
