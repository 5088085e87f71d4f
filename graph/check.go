package graph

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Problem is one broken invariant found by Check.
type Problem struct {
	Layer string `json:"layer,omitempty"`
	What  string `json:"what"`
}

func (p Problem) String() string { return prefixed(p.Layer, p.What) }

// prefixed is what, after where and a colon when there is a where.
func prefixed(where, what string) string {
	if where == "" {
		return what
	}
	return where + ": " + what
}

// Check verifies the store's invariants without changing anything: every
// recorded layer has its directories, parent, link and, when it was made
// with one, its manifest (Verify reads it); depths add up;
// mount counts agree with the kernel; no directory lacks a record; the
// recorded size of applied layers matches their content.
func (s *Store) Check() ([]Problem, error) {
	var probs []Problem
	add := func(id, f string, a ...any) { probs = append(probs, Problem{id, fmt.Sprintf(f, a...)}) }
	err := s.view(context.Background(), func(st *state) error {
		links := map[string]string{}
		for id, r := range st.Layers {
			if other, dup := links[r.Link]; dup {
				add(id, "link %s also used by %s", r.Link, other)
			}
			links[r.Link] = id
			if !validLink(r.Link) {
				add(id, "invalid link name %q", r.Link)
			}
			dirs := []string{s.diffDir(id), s.workDir(id)}
			if s.layout.ownTree(r) {
				dirs = append(dirs, s.rootDir(id))
			}
			for _, d := range dirs {
				if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
					add(id, "missing directory %s", d)
				}
			}
			if r.Manifest {
				if fi, err := os.Lstat(filepath.Join(s.layerDir(id), manifestName)); err != nil || !fi.Mode().IsRegular() {
					add(id, "manifest missing (run verify)")
				}
			}
			want := filepath.Join("..", "layers", id, "diff")
			if got, err := os.Readlink(s.linkPath(r.Link)); err != nil || got != want {
				add(id, "link l/%s does not point to %s", r.Link, want)
			}
			if r.Parent != "" {
				p, ok := st.Layers[r.Parent]
				if !ok {
					add(id, "parent %s does not exist", r.Parent)
				} else {
					if p.Depth+1 != r.Depth {
						add(id, "depth %d, parent depth %d", r.Depth, p.Depth)
					}
					if !p.Committed {
						add(id, "parent %s is not marked committed", r.Parent)
					}
				}
			} else if r.Depth != 1 {
				add(id, "depth %d without parent", r.Depth)
			}
			if _, err := st.chain(id); err != nil {
				add(id, "%v", err)
			}
			if err := s.checkMounts(id); err != nil {
				add(id, "%v", err)
			}
			if r.Applied && !r.Written {
				if n, err := layerSize(s.diffDir(id)); err != nil {
					add(id, "size: %v", err)
				} else if n != r.Size {
					add(id, "content is %d bytes, %d recorded", n, r.Size)
				}
			}
		}
		if ents, err := os.ReadDir(filepath.Join(s.home, "layers")); err == nil {
			for _, e := range ents {
				if _, ok := st.Layers[e.Name()]; !ok {
					add("", "layers/%s has no record", e.Name())
				}
			}
		}
		if ents, err := os.ReadDir(filepath.Join(s.home, "l")); err == nil {
			for _, e := range ents {
				if _, ok := links[e.Name()]; !ok {
					add("", "l/%s belongs to no layer", e.Name())
				}
			}
		}
		if ents, err := os.ReadDir(s.emptyDir()); err != nil || len(ents) > 0 {
			add("", "empty/ is missing or not empty")
		}
		return nil
	})
	sort.Slice(probs, func(i, j int) bool { return probs[i].String() < probs[j].String() })
	return probs, err
}

// Summary is one line per problem, for messages.
func Summary(probs []Problem) string {
	var b strings.Builder
	for _, p := range probs {
		b.WriteString(p.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// checkMounts compares id's mount record with the kernel's mount table.
func (s *Store) checkMounts(id string) error {
	m, err := s.recordedMounts(id)
	if err != nil {
		return err
	}
	if mounted := isMounted(s.mergedDir(id)); mounted != (m.Refs > 0) {
		return fmt.Errorf("mount count %d but mounted=%v", m.Refs, mounted)
	}
	return nil
}
