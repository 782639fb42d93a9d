package buildinfo

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports taskstore_build_info{version,goversion} = 1.
func Collector() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "taskstore_build_info",
		Help:        "Build of the running binary; always 1.",
		ConstLabels: prometheus.Labels{"version": Version, "goversion": runtime.Version()},
	})
	g.Set(1)
	return g
}
