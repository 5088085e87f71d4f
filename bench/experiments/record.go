package experiments

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Prefix starts every output line that carries a Record; EnvPrefix one
// that carries the guest's description (Env).
const (
	Prefix    = "ovlkit-exp: "
	EnvPrefix = "ovlkit-env: "
)

// Record is one sample of one metric: experiment, contender (Case), the
// experiment's parameter X (a container count, a size in bytes, a layer
// count) and the repetition it came from, so that ratios pair samples of
// the same repetition.
type Record struct {
	Exp    string  `json:"exp"`
	Case   string  `json:"case"`
	X      float64 `json:"x"`
	Metric string  `json:"metric"`
	Unit   string  `json:"unit"`
	Rep    int     `json:"rep"`
	Value  float64 `json:"value"`
}

// Env describes the guest a run measured in: kernel, memory, disks, CPU.
type Env map[string]string

// Emit writes r as one line.
func Emit(w io.Writer, r Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode record %+v: %w", r, err)
	}
	_, err = fmt.Fprintf(w, "%s%s\n", Prefix, b)
	return err
}

// EmitEnv writes e as one line.
func EmitEnv(w io.Writer, e Env) error {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode env: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s%s\n", EnvPrefix, b)
	return err
}

// event is the part of a `go test -json` event that carries output.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// Parse reads the records and the environment from `go test -json`
// events (as ovlvm -json writes them) or from plain test output. Output
// of one test may reach it in several events, a line split between
// them, so the output is joined per test before it is split into lines.
func Parse(r io.Reader) ([]Record, Env, error) {
	type key struct{ pkg, test string }
	var order []key
	outs := map[key]*strings.Builder{}
	var plain strings.Builder
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if len(bytes.TrimSpace(line)) > 0 && line[0] == '{' && json.Unmarshal(line, &ev) == nil && ev.Action != "" {
			if ev.Action != "output" {
				continue
			}
			k := key{ev.Package, ev.Test}
			b, ok := outs[k]
			if !ok {
				b = &strings.Builder{}
				outs[k] = b
				order = append(order, k)
			}
			b.WriteString(ev.Output)
			continue
		}
		plain.Write(line)
		plain.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("read test output: %w", err)
	}
	texts := []string{plain.String()}
	for _, k := range order {
		texts = append(texts, outs[k].String())
	}
	var recs []Record
	env := Env{}
	for _, text := range texts {
		for n, line := range strings.Split(text, "\n") {
			line = strings.TrimRight(line, "\r")
			if rest, ok := cutAfter(line, Prefix); ok {
				var rec Record
				if err := json.Unmarshal([]byte(rest), &rec); err != nil {
					return nil, nil, fmt.Errorf("line %d: bad record %q: %w", n+1, rest, err)
				}
				if rec.Exp == "" || rec.Case == "" || rec.Metric == "" {
					return nil, nil, fmt.Errorf("line %d: record without experiment, case or metric: %q", n+1, rest)
				}
				recs = append(recs, rec)
			} else if rest, ok := cutAfter(line, EnvPrefix); ok {
				var e Env
				if err := json.Unmarshal([]byte(rest), &e); err != nil {
					return nil, nil, fmt.Errorf("line %d: bad env %q: %w", n+1, rest, err)
				}
				for k, v := range e {
					env[k] = v
				}
			}
		}
	}
	return recs, env, nil
}

// cutAfter returns what follows prefix in line. The prefix may be preceded
// by other output of the test on the same line (a log line without its
// newline), so it is searched for, not only matched at the start.
func cutAfter(line, prefix string) (string, bool) {
	i := strings.Index(line, prefix)
	if i < 0 {
		return "", false
	}
	return line[i+len(prefix):], true
}
