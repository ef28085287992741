// Command sluice is the stock sluice binary: the sluice command line with
// every built-in module on (CI-build sweeps, project exports, the
// task-cancellation monitor and demo.sleep). See `sluice --help`.
package main

import (
	"os"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/modules"
)

func main() {
	os.Exit(sluice.Main(sluice.Config{Modules: modules.All()}))
}
