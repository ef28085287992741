package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/modules"
)

// sluiceBin is the binary built once for this package's process tests.
var sluiceBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-bin-")
	if err != nil {
		panic(err)
	}
	sluiceBin = filepath.Join(dir, "sluice")
	build := exec.Command("go", "build", "-o", sluiceBin, "../../cmd/sluice")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		panic("build sluice: " + err.Error())
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// runCLI runs the CLI in-process and returns exit code, stdout and stderr.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Run(context.Background(), app.Config{Modules: modules.All()}, args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}
