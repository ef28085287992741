// Package modules lists sluice's built-in modules: the seed systems, each in
// a package of its own below this one.
package modules

import (
	"github.com/sluice-dev/sluice/module"
	"github.com/sluice-dev/sluice/modules/cibuilds"
	"github.com/sluice-dev/sluice/modules/demo"
	"github.com/sluice-dev/sluice/modules/exports"
	"github.com/sluice-dev/sluice/modules/taskcancel"
)

// All returns every built-in module, as the stock sluice binary turns them
// on: CI-build sweeps, project exports (archives in exports.DefaultDir
// unless --export-dir says otherwise), the task-cancellation monitor and
// demo.sleep.
func All() []module.Module {
	return []module.Module{
		cibuilds.Module(),
		exports.Module(exports.Config{}),
		taskcancel.Module(),
		demo.Module(),
	}
}
