package experiments

import (
	"fmt"
	"math"
	"sort"
)

// Summary is the distribution of one metric for one case and parameter
// over the repetitions: its median and spread (extremes and quartiles).
type Summary struct {
	Exp    string  `json:"exp"`
	Case   string  `json:"case"`
	X      float64 `json:"x"`
	Metric string  `json:"metric"`
	Unit   string  `json:"unit"`
	N      int     `json:"n"`
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Q1     float64 `json:"q1"`
	Q3     float64 `json:"q3"`
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1) of vs by linear
// interpolation between the closest ranks; NaN for no values.
func Quantile(vs []float64, q float64) float64 {
	if len(vs) == 0 || q < 0 || q > 1 || math.IsNaN(q) {
		return math.NaN()
	}
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

// Median is Quantile(vs, 0.5).
func Median(vs []float64) float64 { return Quantile(vs, 0.5) }

type groupKey struct {
	exp, cs string
	x       float64
	metric  string
}

// Summarize groups records by experiment, case, parameter and metric, in
// the order they first appear, and summarizes each group.
func Summarize(recs []Record) []Summary {
	var order []groupKey
	vals := map[groupKey][]float64{}
	units := map[groupKey]string{}
	for _, r := range recs {
		k := groupKey{r.Exp, r.Case, r.X, r.Metric}
		if _, ok := vals[k]; !ok {
			order = append(order, k)
			units[k] = r.Unit
		}
		vals[k] = append(vals[k], r.Value)
	}
	out := make([]Summary, 0, len(order))
	for _, k := range order {
		vs := vals[k]
		out = append(out, Summary{
			Exp: k.exp, Case: k.cs, X: k.x, Metric: k.metric, Unit: units[k], N: len(vs),
			Median: Median(vs), Min: Quantile(vs, 0), Max: Quantile(vs, 1),
			Q1: Quantile(vs, 0.25), Q3: Quantile(vs, 0.75),
		})
	}
	return out
}

// Ratios divides each sample of metric for case num by the sample of the
// same metric, parameter and repetition for case den: ratios within one
// repetition, so that a slow phase of the host weighs on both sides. The
// results are records of case "num/den" and unit "x". A sample without
// its partner is an error: the run was incomplete.
func Ratios(recs []Record, exp, metric, num, den string) ([]Record, error) {
	type k struct {
		x   float64
		rep int
	}
	dens := map[k]float64{}
	for _, r := range recs {
		if r.Exp == exp && r.Metric == metric && r.Case == den {
			dens[k{r.X, r.Rep}] = r.Value
		}
	}
	var out []Record
	for _, r := range recs {
		if r.Exp != exp || r.Metric != metric || r.Case != num {
			continue
		}
		d, ok := dens[k{r.X, r.Rep}]
		if !ok {
			return nil, fmt.Errorf("%s %s: %s has x=%g rep %d, %s does not", exp, metric, num, r.X, r.Rep, den)
		}
		if d == 0 {
			return nil, fmt.Errorf("%s %s: %s is 0 at x=%g rep %d", exp, metric, den, r.X, r.Rep)
		}
		out = append(out, Record{Exp: exp, Case: num + "/" + den, X: r.X, Metric: metric, Unit: "x", Rep: r.Rep, Value: r.Value / d})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s %s: no samples of %s", exp, metric, num)
	}
	return out, nil
}

// Select returns the summaries of one experiment and metric.
func Select(ss []Summary, exp, metric string) []Summary {
	var out []Summary
	for _, s := range ss {
		if s.Exp == exp && s.Metric == metric {
			out = append(out, s)
		}
	}
	return out
}

// Cases returns the cases of ss in their first order.
func Cases(ss []Summary) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range ss {
		if !seen[s.Case] {
			seen[s.Case] = true
			out = append(out, s.Case)
		}
	}
	return out
}
