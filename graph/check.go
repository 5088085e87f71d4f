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
	c := &checker{s: s, links: map[string]string{}}
	err := s.view(context.Background(), func(st *state) error {
		for id, r := range st.Layers {
			c.checkLayer(st, id, r)
		}
		c.checkStrays(st)
		return nil
	})
	sort.Slice(c.probs, func(i, j int) bool { return c.probs[i].String() < c.probs[j].String() })
	return c.probs, err
}

// A checker collects the problems of one Check.
type checker struct {
	s     *Store
	probs []Problem
	links map[string]string // short link -> layer
}

func (c *checker) add(id, f string, a ...any) {
	c.probs = append(c.probs, Problem{id, fmt.Sprintf(f, a...)})
}

// checkLayer checks one layer's record against its directory, link,
// parent, mounts and size.
func (c *checker) checkLayer(st *state, id string, r *layerRecord) {
	s := c.s
	if other, dup := c.links[r.Link]; dup {
		c.add(id, "link %s also used by %s", r.Link, other)
	}
	c.links[r.Link] = id
	if !validLink(r.Link) {
		c.add(id, "invalid link name %q", r.Link)
	}
	c.checkDirs(id, r)
	want := filepath.Join("..", "layers", id, "diff")
	if got, err := os.Readlink(s.linkPath(r.Link)); err != nil || got != want {
		c.add(id, "link l/%s does not point to %s", r.Link, want)
	}
	c.checkParent(st, id, r)
	if _, err := st.chain(id); err != nil {
		c.add(id, "%v", err)
	}
	if err := s.checkMounts(id); err != nil {
		c.add(id, "%v", err)
	}
	if r.Applied && !r.Written {
		if n, err := layerSize(s.diffDir(id)); err != nil {
			c.add(id, "size: %v", err)
		} else if n != r.Size {
			c.add(id, "content is %d bytes, %d recorded", n, r.Size)
		}
	}
}

// checkDirs checks that the layer's directories and manifest are there.
func (c *checker) checkDirs(id string, r *layerRecord) {
	s := c.s
	dirs := []string{s.diffDir(id), s.workDir(id)}
	if s.layout.ownTree(r) {
		dirs = append(dirs, s.rootDir(id))
	}
	for _, d := range dirs {
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
			c.add(id, "missing directory %s", d)
		}
	}
	if r.Manifest {
		if fi, err := os.Lstat(filepath.Join(s.layerDir(id), manifestName)); err != nil || !fi.Mode().IsRegular() {
			c.add(id, "manifest missing (run verify)")
		}
	}
}

// checkParent checks the layer's depth against its parent's.
func (c *checker) checkParent(st *state, id string, r *layerRecord) {
	if r.Parent == "" {
		if r.Depth != 1 {
			c.add(id, "depth %d without parent", r.Depth)
		}
		return
	}
	p, ok := st.Layers[r.Parent]
	if !ok {
		c.add(id, "parent %s does not exist", r.Parent)
		return
	}
	if p.Depth+1 != r.Depth {
		c.add(id, "depth %d, parent depth %d", r.Depth, p.Depth)
	}
	if !p.Committed {
		c.add(id, "parent %s is not marked committed", r.Parent)
	}
}

// checkStrays looks for layer directories and links without a record,
// and for content in empty/. It runs after checkLayer has seen every
// layer's link.
func (c *checker) checkStrays(st *state) {
	s := c.s
	if ents, err := os.ReadDir(filepath.Join(s.home, "layers")); err == nil {
		for _, e := range ents {
			if _, ok := st.Layers[e.Name()]; !ok {
				c.add("", "layers/%s has no record", e.Name())
			}
		}
	}
	if ents, err := os.ReadDir(filepath.Join(s.home, "l")); err == nil {
		for _, e := range ents {
			if _, ok := c.links[e.Name()]; !ok {
				c.add("", "l/%s belongs to no layer", e.Name())
			}
		}
	}
	if ents, err := os.ReadDir(s.emptyDir()); err != nil || len(ents) > 0 {
		c.add("", "empty/ is missing or not empty")
	}
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
	mounted := isMounted(s.mergedDir(id))
	if m.Dir {
		// Its diff directory is handed out; nothing is mounted.
		if mounted {
			return fmt.Errorf("%d references to the diff directory but mounted", m.Refs)
		}
		return nil
	}
	if mounted != (m.Refs > 0) {
		return fmt.Errorf("mount count %d but mounted=%v", m.Refs, mounted)
	}
	return nil
}
