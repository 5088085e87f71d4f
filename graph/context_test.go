package graph

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestContextEndsLockWaits holds a lock each blocking method needs and
// checks that the method gives up with its context's error, leaving the
// store as it was.
func TestContextEndsLockWaits(t *testing.T) {
	s := openTest(t, t.TempDir(), LayoutOverlay)
	bg := context.Background()
	if err := s.Create(bg, "a", ""); err != nil {
		t.Fatal(err)
	}
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(bg, 30*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}

	l, err := s.lockLayer(bg, "a")
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]func(ctx context.Context) error{
		"Remove":             func(ctx context.Context) error { return s.Remove(ctx, "a") },
		"Get":                func(ctx context.Context) error { _, err := s.Get(ctx, "a"); return err },
		"Put":                func(ctx context.Context) error { return s.Put(ctx, "a") },
		"Create on":          func(ctx context.Context) error { return s.Create(ctx, "b", "a") },
		"CreateReadWrite on": func(ctx context.Context) error { return s.CreateReadWrite(ctx, "c", "a") },
	}
	for name, call := range calls {
		start := time.Now()
		err := call(short())
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s with the layer locked: %v, want context.DeadlineExceeded", name, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s took %v to see its deadline", name, d)
		}
	}
	l.unlock()

	unlock, err := s.lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Create(short(), "d", ""); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Create with the store locked: %v, want context.DeadlineExceeded", err)
	}
	unlock()

	for _, id := range []string{"b", "c", "d"} {
		if s.Exists(id) {
			t.Errorf("%s exists after its Create gave up", id)
		}
	}
	if !s.Exists("a") {
		t.Error("a is gone after its Remove gave up")
	}
}

// TestContextWaitsForRelease checks that a cancellable context waits for
// a held lock rather than failing at once.
func TestContextWaitsForRelease(t *testing.T) {
	s := openTest(t, t.TempDir(), LayoutOverlay)
	bg := context.Background()
	if err := s.Create(bg, "a", ""); err != nil {
		t.Fatal(err)
	}
	l, err := s.lockLayer(bg, "a")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		l.unlock()
	}()
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	if err := s.Remove(ctx, "a"); err != nil {
		t.Fatalf("Remove once the lock is released: %v", err)
	}
	if s.Exists("a") {
		t.Error("a exists after Remove")
	}
}

// TestCancelledContextStartsNothing: a call with a done context fails
// before it changes anything, even when no lock is held.
func TestCancelledContextStartsNothing(t *testing.T) {
	s := openTest(t, t.TempDir(), LayoutOverlay)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Create(ctx, "a", ""); !errors.Is(err, context.Canceled) {
		t.Errorf("Create: %v, want context.Canceled", err)
	}
	if s.Exists("a") {
		t.Error("a exists after a cancelled Create")
	}
	if err := s.Create(context.Background(), "a", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, "a"); !errors.Is(err, context.Canceled) {
		t.Errorf("Remove: %v, want context.Canceled", err)
	}
	if !s.Exists("a") {
		t.Error("a is gone after a cancelled Remove")
	}
}

// TestLoggerReportsFailedCleanup: a leftover that recovery cannot remove
// does not fail Open, and the logger hears of it.
func TestLoggerReportsFailedCleanup(t *testing.T) {
	home := t.TempDir()
	openTest(t, home, LayoutOverlay).Close()
	// What a crashed compaction leaves is a file; a directory with
	// something in it is one os.Remove cannot take.
	if err := os.MkdirAll(filepath.Join(home, ".state-x", "in"), 0o700); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	s, err := Open(home, Options{Features: hostFeatures(), Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatalf("open with an unremovable leftover: %v", err)
	}
	s.Close()
	if out := buf.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "remove unfinished state file") {
		t.Errorf("log = %q, want a warning about the leftover state file", out)
	}
}

// TestBackgroundMounter: the driver-style interface without contexts
// reaches the store's Get and Put.
func TestBackgroundMounter(t *testing.T) {
	s := openTest(t, t.TempDir(), LayoutOverlay)
	var m LayerMounter = s.Background()
	if _, err := m.Get("missing"); !errors.Is(err, ErrNotExist) {
		t.Errorf("Get of a missing layer: %v, want ErrNotExist", err)
	}
	if err := s.Create(context.Background(), "a", ""); err != nil {
		t.Fatal(err)
	}
	if err := m.Put("a"); !errors.Is(err, ErrNotMounted) {
		t.Errorf("Put of an unmounted layer: %v, want ErrNotMounted", err)
	}
}
