package graph

import (
	"crypto/rand"
	"fmt"
	"math/big"
)

// linkAlphabet avoids lower case so that names stay distinct on
// case-insensitive backing filesystems.
const linkAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

// linkLen is the length of a short link name. The legacy mount data of a
// 500-layer mount made relative to l/ costs (linkLen+1) bytes per lower:
// 3500 bytes, which leaves room in a 4096-byte page for the upper and work
// paths of a 128-character ID and the mount options. 36^6 names make
// collisions rare; newLink retries on one anyway.
const linkLen = 6

// newLink returns a random link name for which inUse is false.
func newLink(inUse func(string) bool) (string, error) {
	max := big.NewInt(int64(len(linkAlphabet)))
	for attempt := 0; attempt < 100; attempt++ {
		b := make([]byte, linkLen)
		for i := range b {
			n, err := rand.Int(rand.Reader, max)
			if err != nil {
				return "", fmt.Errorf("link name: %w", err)
			}
			b[i] = linkAlphabet[n.Int64()]
		}
		if !inUse(string(b)) {
			return string(b), nil
		}
	}
	return "", fmt.Errorf("link name: no free name after 100 attempts")
}

// validLink reports whether name could have come from newLink; recovery
// removes anything else found in l/.
func validLink(name string) bool {
	if len(name) != linkLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
