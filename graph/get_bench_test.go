package graph

import (
	"context"
	"testing"
)

// BenchmarkGetDirect is moby graphtest's DriverBenchGetEmpty on the host:
// Get of a layer without a parent, which hands out its diff directory and
// mounts nothing, so it runs without the guest. Only Get is timed; the
// Put after it is not, as in graphtest.
func BenchmarkGetDirect(b *testing.B) {
	ctx := context.Background()
	s, err := Open(b.TempDir(), Options{Create: true, Sync: SyncNone, Features: hostFeatures()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.Create(ctx, "base", ""); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		if _, err := s.Get(ctx, "base"); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := s.Put(ctx, "base"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
