package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/ovlkit/ovlkit/graph"
)

// repairResult is what check --repair did to one damaged layer.
type repairResult struct {
	Layer string `json:"layer"`
	// State is the layer's state after the repair.
	State graph.LayerState `json:"state,omitempty"`
	Error string           `json:"error,omitempty"`
}

// verifyStore is check --verify [--repair]: the store's invariants, every
// layer (or c.id) against its manifest, and with --repair a Repair of each
// damaged layer, parents first, before the layers are verified and the
// store checked again.
func (c command) verifyStore(ctx context.Context, s *graph.Store, out io.Writer) error {
	verify := func() ([]graph.Report, error) {
		if c.id != "" {
			r, err := s.Verify(ctx, c.id)
			return []graph.Report{r}, err
		}
		return s.VerifyAll(ctx)
	}
	reps, err := verify()
	if err != nil {
		return err
	}
	var repairs []repairResult
	if c.repair {
		for _, r := range reps {
			if r.State != graph.StateDamaged {
				continue
			}
			res := repairResult{Layer: r.Layer}
			after, err := s.Repair(ctx, r.Layer)
			if err != nil {
				res.Error = err.Error()
			} else {
				res.State = after.State
			}
			repairs = append(repairs, res)
		}
		if reps, err = verify(); err != nil {
			return err
		}
	}
	probs, err := s.Check()
	if err != nil {
		return err
	}
	damaged, waiting := 0, 0
	for _, r := range reps {
		switch r.State {
		case graph.StateDamaged:
			damaged++
		case graph.StateNeedsApply:
			waiting++
		}
	}
	failed := 0
	for _, r := range repairs {
		if r.Error != "" {
			failed++
		}
	}
	if err := c.emitVerify(out, probs, reps, repairs); err != nil {
		return err
	}
	switch {
	case len(probs) > 0 || damaged > 0 || failed > 0:
		var parts []string
		if len(probs) > 0 {
			parts = append(parts, fmt.Sprintf("%d problem(s)", len(probs)))
		}
		if damaged > 0 {
			parts = append(parts, fmt.Sprintf("%d damaged layer(s)", damaged))
		}
		if failed > 0 {
			parts = append(parts, fmt.Sprintf("%d repair(s) failed", failed))
		}
		return errors.New(strings.Join(parts, ", "))
	case waiting > 0:
		return exitStatus{3, fmt.Sprintf("%d layer(s) need their tar applied again", waiting)}
	}
	return nil
}

func (c command) emitVerify(out io.Writer, probs []graph.Problem, reps []graph.Report, repairs []repairResult) error {
	if c.json {
		if probs == nil {
			probs = []graph.Problem{}
		}
		ok := len(probs) == 0
		for _, r := range reps {
			ok = ok && r.State != graph.StateDamaged && r.State != graph.StateNeedsApply
		}
		v := map[string]any{"ok": ok, "problems": probs, "layers": reps}
		if c.repair {
			if repairs == nil {
				repairs = []repairResult{}
			}
			v["repairs"] = repairs
		}
		return writeJSON(out, v)
	}
	var b strings.Builder
	for _, r := range repairs {
		if r.Error != "" {
			fmt.Fprintf(&b, "%s: not repaired: %s\n", quoteName(r.Layer), escapeMessage(r.Error))
		} else if r.State == graph.StateNeedsApply {
			fmt.Fprintf(&b, "%s: repaired: content reset, apply its tar again\n", quoteName(r.Layer))
		} else {
			fmt.Fprintf(&b, "%s: repaired: %s\n", quoteName(r.Layer), r.State)
		}
	}
	for _, r := range reps {
		fmt.Fprintf(&b, "%s: %s", quoteName(r.Layer), r.State)
		switch r.State {
		case graph.StateOK:
			fmt.Fprintf(&b, " (%d entries)", r.Entries)
		case graph.StateNeedsApply:
			b.WriteString(" (apply its tar again)")
		}
		b.WriteByte('\n')
		for _, d := range r.Damage {
			fix := "repair resets the layer"
			if d.Derivable {
				fix = "repair rebuilds it"
			}
			// Paths inside a layer are the image author's choice.
			fmt.Fprintf(&b, "  %s [%s; %s]\n", escapeMessage(d.String()), d.Kind, fix)
		}
	}
	for _, p := range probs {
		fmt.Fprintln(&b, escapeMessage(p.String()))
	}
	if len(probs) == 0 {
		b.WriteString("store: ok\n")
	}
	_, err := io.WriteString(out, b.String())
	return err
}
