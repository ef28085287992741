// Package cli is the sluice command line: the cobra commands of sluice.Main,
// on top of app, with the program's own kinds and modules known to every
// command.
package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/sluice-dev/sluice/app"
)

// Run executes the command line args of the program cfg describes and
// returns the exit code; cfg's settings are the defaults of the flags.
// Cancelling ctx is how a signal reaches the command. A program whose kinds
// do not add up (none at all, or one registered twice) exits 1 before any
// command runs.
func Run(ctx context.Context, cfg app.Config, args []string, stdout, stderr io.Writer) int {
	cfg.Name = cmp.Or(cfg.Name, "sluice")
	name := cfg.Name
	prog := cfg.Program()
	registry, err := prog.Registry()
	if err == nil {
		_, err = prog.CheckDeclarations(registry)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", name, strings.TrimPrefix(err.Error(), "sluice: "))
		return exitFailure
	}
	root, g := newRootCmd(stderr, cfg, registry)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err = root.ExecuteContext(ctx)
	g.shutdownTracing()
	code := exitCode(err)
	if _, silent := err.(*silentExit); err != nil && !silent {
		fmt.Fprintf(stderr, "%s: %s\n", name, err)
		if code == exitUsage {
			// The command's help, or the program's for an unknown command.
			cmd, _, findErr := root.Find(args)
			if findErr != nil || cmd == nil {
				cmd = root
			}
			fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		}
	}
	return code
}
