package metrics

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// The modules whose versions sluice_build_info reports.
const (
	sluiceModule = "github.com/sluice-dev/sluice"
	riverModule  = "github.com/riverqueue/river"
)

// RegisterBuildInfo registers sluice_build_info{version,goversion,
// river_version} = 1: sluice's module version (the main module's when
// sluice is the program, "(devel)" for a build from a checkout), Go's, and
// River's.
func RegisterBuildInfo(reg prometheus.Registerer) error {
	version, river := "(devel)", "unknown"
	if info, ok := debug.ReadBuildInfo(); ok {
		if info.Main.Path == sluiceModule && info.Main.Version != "" {
			version = info.Main.Version
		}
		for _, dep := range info.Deps {
			switch dep.Path {
			case sluiceModule:
				version = dep.Version
			case riverModule:
				river = dep.Version
			}
		}
	}
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_build_info",
		Help: "1, labelled with sluice's version, Go's and River's.",
	}, []string{"version", "goversion", "river_version"})
	g.WithLabelValues(version, runtime.Version(), river).Set(1)
	return reg.Register(g)
}
