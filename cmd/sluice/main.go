// Command sluice is a SQL-centric job runner on a Postgres queue: River jobs
// whose whole state lives in Postgres. See `sluice --help`.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the command line args and returns the exit code. Cancelling
// ctx is how a signal reaches the command.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stderr)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	code := exitCode(err)
	if _, silent := err.(*silentExit); err != nil && !silent {
		fmt.Fprintf(stderr, "sluice: %s\n", err)
		if code == exitUsage {
			if cmd, _, findErr := root.Find(args); findErr == nil && cmd != nil && cmd != root {
				fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
			}
		}
	}
	return code
}
