package main

import (
	"fmt"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/ovlkit/ovlkit/bench/experiments"
)

// chart describes one figure: a line per case through the medians, with
// bars from the lowest to the highest sample.
type chart struct {
	title, xLabel, yLabel string
	logX, logY            bool
	series                []series
	// xTick, when set, puts a tick at every parameter of the data,
	// labelled by it, instead of the axis' own ticks.
	xTick func(float64) string
}

type series struct {
	name   string
	points []experiments.Summary
}

// spread adapts summaries to gonum's XYer and YErrorer.
type spread []experiments.Summary

func (s spread) Len() int                    { return len(s) }
func (s spread) XY(i int) (float64, float64) { return s[i].X, s[i].Median }
func (s spread) YError(i int) (float64, float64) {
	return s[i].Median - s[i].Min, s[i].Max - s[i].Median
}

// save draws c into a PNG file of 16×10 cm.
func (c chart) save(path string) error {
	if len(c.series) == 0 {
		return fmt.Errorf("%s: nothing to plot", path)
	}
	p := plot.New()
	p.Title.Text = c.title
	p.X.Label.Text = c.xLabel
	p.Y.Label.Text = c.yLabel
	if c.logX {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	if c.logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	for i, s := range c.series {
		if len(s.points) == 0 {
			return fmt.Errorf("%s: series %s has no points", path, s.name)
		}
		for _, pt := range s.points {
			if (c.logX && pt.X <= 0) || (c.logY && pt.Min <= 0) || math.IsNaN(pt.Median) {
				return fmt.Errorf("%s: series %s: point x=%g median=%g min=%g does not fit the scale", path, s.name, pt.X, pt.Median, pt.Min)
			}
		}
		line, points, err := plotter.NewLinePoints(spread(s.points))
		if err != nil {
			return fmt.Errorf("%s: series %s: %w", path, s.name, err)
		}
		line.Color = plotutil.Color(i)
		line.Dashes = plotutil.Dashes(i)
		points.Color = plotutil.Color(i)
		points.Shape = plotutil.Shape(i)
		bars, err := plotter.NewYErrorBars(spread(s.points))
		if err != nil {
			return fmt.Errorf("%s: series %s: %w", path, s.name, err)
		}
		bars.Color = plotutil.Color(i)
		p.Add(line, points, bars)
		p.Legend.Add(s.name, line, points)
	}
	// Room above the data for the legend, which sits in the top left.
	lines := float64(len(c.series)) + 1
	if c.logY {
		p.Y.Max *= math.Pow(10, 0.12*lines*math.Log10(p.Y.Max/p.Y.Min))
	} else {
		p.Y.Min = min(p.Y.Min, 0)
		p.Y.Max += 0.12 * lines * (p.Y.Max - p.Y.Min)
	}
	if c.xTick != nil {
		seen := map[float64]bool{}
		var ticks []plot.Tick
		for _, s := range c.series {
			for _, pt := range s.points {
				if !seen[pt.X] {
					seen[pt.X] = true
					ticks = append(ticks, plot.Tick{Value: pt.X, Label: c.xTick(pt.X)})
				}
			}
		}
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
	}
	if err := p.Save(16*vg.Centimeter, 12*vg.Centimeter, path); err != nil {
		return fmt.Errorf("save plot %s: %w", path, err)
	}
	return nil
}
