package telemetry

import (
	"fmt"
	"io"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// Exposition collects a status as Prometheus metrics and writes them in
// the text formats scrapers and node_exporter's textfile collector read.
type Exposition struct {
	reg    *prometheus.Registry
	gauges map[string]*prometheus.GaugeVec
	counts map[string]*prometheus.CounterVec
}

// NewExposition returns an empty exposition.
func NewExposition() *Exposition {
	return &Exposition{reg: prometheus.NewRegistry(), gauges: map[string]*prometheus.GaugeVec{}, counts: map[string]*prometheus.CounterVec{}}
}

// Gauge sets the gauge name{labels} to v; help and the label names are
// fixed by the first call for a name.
func (e *Exposition) Gauge(name, help string, labels prometheus.Labels, v float64) {
	g, ok := e.gauges[name]
	if !ok {
		g = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, keys(labels))
		e.reg.MustRegister(g)
		e.gauges[name] = g
	}
	g.With(labels).Set(v)
}

// Counter sets the counter name_total{labels} to v (name without the
// _total suffix): a total Redis or the archive keeps, read once.
func (e *Exposition) Counter(name, help string, labels prometheus.Labels, v float64) {
	c, ok := e.counts[name]
	if !ok {
		c = prometheus.NewCounterVec(prometheus.CounterOpts{Name: name + "_total", Help: help}, keys(labels))
		e.reg.MustRegister(c)
		e.counts[name] = c
	}
	c.With(labels).Add(v)
}

func keys(l prometheus.Labels) []string {
	out := make([]string, 0, len(l))
	for k := range l {
		out = append(out, k)
	}
	return out
}

// Formats of Write.
const (
	FormatOpenMetrics = "openmetrics" // OpenMetrics 1.0 text, ends with # EOF
	FormatPrometheus  = "prometheus"  // Prometheus text 0.0.4 (node_exporter's textfile collector)
)

// Write encodes every metric in format.
func (e *Exposition) Write(w io.Writer, format string) error {
	var f expfmt.Format
	switch format {
	case FormatOpenMetrics:
		f = expfmt.NewFormat(expfmt.TypeOpenMetrics)
	case FormatPrometheus:
		f = expfmt.NewFormat(expfmt.TypeTextPlain)
	default:
		return fmt.Errorf("format %q: want %s or %s", format, FormatOpenMetrics, FormatPrometheus)
	}
	families, err := e.reg.Gather()
	if err != nil {
		return err
	}
	enc := expfmt.NewEncoder(w, f)
	for _, mf := range families {
		if err := enc.Encode(mf); err != nil {
			return err
		}
	}
	if closer, ok := enc.(expfmt.Closer); ok {
		return closer.Close() // OpenMetrics' # EOF
	}
	return nil
}
