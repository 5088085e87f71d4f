package graph

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// validID accepts exactly what the documented pattern matches.
func TestValidIDMatchesPattern(t *testing.T) {
	pattern := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)
	ids := []string{"", "a", "A9", "_a", ".a", "-a", "a_b.c-d", "..", "a/b", "a b", "é", "a\x00",
		strings.Repeat("x", 128), strings.Repeat("x", 129), "0123456789abcdef"}
	const alphabet = "aZ09_.-/ \x00\xff"
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		b := make([]byte, rng.IntN(131))
		for j := range b {
			b[j] = alphabet[rng.IntN(len(alphabet))]
		}
		ids = append(ids, string(b))
	}
	for _, id := range ids {
		if got, want := validID(id) == nil, pattern.MatchString(id); got != want {
			t.Errorf("validID(%q) accepts=%v, the pattern says %v", id, got, want)
		}
	}
}
