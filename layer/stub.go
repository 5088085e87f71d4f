package layer

import (
	"context"
	"errors"
	"io"
)

var errNotYet = errors.New("layer: not implemented yet")

func apply(ctx context.Context, root string, r io.Reader, opts ApplyOptions) (int64, error) {
	return 0, errNotYet
}

func export(ctx context.Context, w io.Writer, diff string, opts ExportOptions) error {
	return errNotYet
}

func changes(ctx context.Context, diff string, lowers []string, opts ExportOptions) ([]Change, error) {
	return nil, errNotYet
}

func treeChanges(ctx context.Context, oldRoot, newRoot string) ([]Change, error) {
	return nil, errNotYet
}

func exportChanges(ctx context.Context, w io.Writer, newRoot string, changes []Change) error {
	return errNotYet
}

func size(diff string) (int64, error) { return 0, errNotYet }
