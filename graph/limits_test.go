package graph

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ovlkit/ovlkit/layer"
)

// A layer over one of the store's limits is refused with the limit's
// error, and leaves nothing: the layer stays empty and unapplied, staging
// is empty, Check finds nothing, and a layer within the limits applies.
func TestApplyDiffLimits(t *testing.T) {
	home := t.TempDir()
	s, err := Open(home, Options{Create: true, Sync: SyncNone, Features: hostFeatures(),
		Limits: layer.Limits{MaxSize: 10, MaxEntries: 4, MaxDepth: 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	cases := []struct {
		name   string
		tar    func() []byte
		want   error
		naming string
	}{
		{"size", func() []byte { return tarOf(t, reg("a", "12345"), reg("b", "123456")).Bytes() }, layer.ErrTooLarge, "MaxSize of 10 bytes"},
		{"entries", func() []byte {
			return tarOf(t, dir("d/"), reg("d/a", "1"), reg("d/b", "2"), reg("d/c", "3"), reg("d/e", "4")).Bytes()
		}, layer.ErrTooManyEntries, "MaxEntries of 4 entries"},
		{"depth", func() []byte { return tarOf(t, reg("x/y/z", "1")).Bytes() }, layer.ErrTooDeep, "MaxDepth of 2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := "l-" + c.name
			if err := s.Create(context.Background(), id, ""); err != nil {
				t.Fatal(err)
			}
			_, err := s.ApplyDiff(ctx, id, strings.NewReader(string(c.tar())))
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.naming) {
				t.Fatalf("ApplyDiff: %v, want %v naming %q", err, c.want, c.naming)
			}
			if empty, err := dirEmpty(s.diffDir(id)); err != nil || !empty {
				t.Errorf("diff of the refused layer not empty: %v %v", empty, err)
			}
			if ents, _ := os.ReadDir(filepath.Join(home, "staging")); len(ents) != 0 {
				t.Errorf("staging holds %d entries after a refused layer", len(ents))
			}
			if info, err := s.Layer(id); err != nil || info.Size != 0 {
				t.Errorf("refused layer recorded as %+v %v", info, err)
			}
			if problems, err := s.Check(); err != nil || len(problems) != 0 {
				t.Errorf("Check after a refused layer: %v %v", problems, err)
			}
			if _, err := s.ApplyDiff(ctx, id, tarOf(t, dir("x/"), reg("x/ok", "1234567890"))); err != nil {
				t.Errorf("layer within the limits: %v", err)
			}
		})
	}
}
