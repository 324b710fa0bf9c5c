// Command curves draws the scaling curves of BENCHMARKS.md as PNG line
// charts. It reads a JSON list of charts (scripts/bench-curves.sh writes it)
// and writes one PNG per chart into a directory.
//
//	go run ./curves -out ../docs curves.json
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Chart is one PNG: series of (x, y) points on a linear or log10 x axis.
type Chart struct {
	File   string   `json:"file"`
	Title  string   `json:"title"`
	XLabel string   `json:"xlabel"`
	YLabel string   `json:"ylabel"`
	LogX   bool     `json:"logx"`
	Series []Series `json:"series"`
}

// Series is one line.
type Series struct {
	Name   string       `json:"name"`
	Points [][2]float64 `json:"points"`
}

const (
	width, height          = 720, 420
	left, right, top, bott = 90, 30, 40, 60
)

var palette = []color.RGBA{{31, 119, 180, 255}, {214, 39, 40, 255}, {44, 160, 44, 255}, {148, 103, 189, 255}}

func main() {
	out := flag.String("out", ".", "directory for the PNG files")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: curves -out DIR CHARTS.json")
		os.Exit(2)
	}
	b, err := os.ReadFile(flag.Arg(0))
	var charts []Chart
	if err == nil {
		err = json.Unmarshal(b, &charts)
	}
	for _, c := range charts {
		if err != nil {
			break
		}
		err = write(filepath.Join(*out, c.File), draw(c))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "curves:", err)
		os.Exit(1)
	}
}

func write(path string, img image.Image) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// draw renders c: axes with ticks, one polyline with dots per series, a legend.
func draw(c Chart) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	fill(img, color.White)
	fx := func(x float64) float64 {
		if c.LogX {
			return math.Log10(x)
		}
		return x
	}
	x0, x1, y1 := math.Inf(1), math.Inf(-1), 0.0
	for _, s := range c.Series {
		for _, p := range s.Points {
			x0, x1, y1 = math.Min(x0, fx(p[0])), math.Max(x1, fx(p[0])), math.Max(y1, p[1])
		}
	}
	if x1 == x0 {
		x1 = x0 + 1
	}
	y1 = niceCeil(y1 * 1.1)
	px := func(x float64) int { return left + int((fx(x)-x0)/(x1-x0)*float64(width-left-right)) }
	py := func(y float64) int { return height - bott - int(y/y1*float64(height-top-bott)) }
	gray, black := color.RGBA{200, 200, 200, 255}, color.RGBA{0, 0, 0, 255}
	for i := 0; i <= 5; i++ { // horizontal grid and y ticks
		y := y1 * float64(i) / 5
		line(img, left, py(y), width-right, py(y), gray)
		text(img, 5, py(y)+4, short(y), black)
	}
	for _, s := range c.Series[:1] { // x ticks at the first series' points
		for _, p := range s.Points {
			line(img, px(p[0]), height-bott, px(p[0]), height-bott+5, black)
			text(img, px(p[0])-15, height-bott+18, short(p[0]), black)
		}
	}
	line(img, left, top, left, height-bott, black)
	line(img, left, height-bott, width-right, height-bott, black)
	text(img, left+140, 16, c.Title, black)
	text(img, width/2-len(c.XLabel)*3, height-15, c.XLabel, black)
	text(img, 5, top-10, c.YLabel, black)
	for i, s := range c.Series {
		col := palette[i%len(palette)]
		for j, p := range s.Points {
			dot(img, px(p[0]), py(p[1]), col)
			if j > 0 {
				q := s.Points[j-1]
				thick(img, px(q[0]), py(q[1]), px(p[0]), py(p[1]), col)
			}
		}
		ly := top + 10 + 16*i
		thick(img, width-right-190, ly-4, width-right-170, ly-4, col)
		text(img, width-right-165, ly, s.Name, black)
	}
	return img
}

func fill(img *image.RGBA, c color.Color) {
	for y := 0; y < height; y++ {
		for x := 0; x < width; x++ {
			img.Set(x, y, c)
		}
	}
}

// line draws a one-pixel line (Bresenham).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		img.Set(x0, y0, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e, x0 = e+dy, x0+sx
		}
		if e2 <= dx {
			e, y0 = e+dx, y0+sy
		}
	}
}

func thick(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	for d := -1; d <= 1; d++ {
		line(img, x0, y0+d, x1, y1+d, c)
	}
}

func dot(img *image.RGBA, x, y int, c color.Color) {
	for dy := -3; dy <= 3; dy++ {
		for dx := -3; dx <= 3; dx++ {
			if dx*dx+dy*dy <= 9 {
				img.Set(x+dx, y+dy, c)
			}
		}
	}
}

func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// short formats an axis value: 100k, 1M, 2.5, ...
func short(v float64) string {
	switch {
	case v >= 1e6 && math.Mod(v, 1e6) == 0:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e3 && math.Mod(v, 1e3) == 0:
		return fmt.Sprintf("%gk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v >= 10:
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2g", v)
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}
