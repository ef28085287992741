package exports

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/module"
)

// newExportCmd is `sluice export PROJECT_ID [--parallel]`.
func newExportCmd(cli module.CLI) *cobra.Command {
	var parallel bool
	cmd := &cobra.Command{
		Use:   "export PROJECT_ID [--parallel]",
		Short: "Start a project export: an export job row and its export.project River job",
		Long: `export starts an export of the project's ci_builds. In one transaction it
inserts a project_export_jobs row (status queued) and its export.project River
job, and records the River job's id in the row's job_id. It prints both ids.

A worker then marks the row started, writes the archive
` + "`project-PROJECT_ID-export-EXPORT_JOB_ID.ndjson.gz`" + ` to its export directory
(--export-dir, $SLUICE_EXPORT_DIR, default ` + DefaultDir + `) and marks the row finished,
or failed after its last attempt. With --parallel the export also tracks each
relation (project, ci_builds) in project_relation_exports.

export.stuck_jobs marks failed an export left queued or started whose River
job has finished or no longer exists.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return module.Usagef("%s expects a PROJECT_ID, got %d argument(s)", cmd.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			projectID, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || projectID <= 0 {
				return module.Usagef("invalid PROJECT_ID %q: want a positive integer", args[0])
			}
			pool, client, err := cli.OpenClient(cmd, "sluice export")
			if err != nil {
				return err
			}
			defer pool.Close()
			export, err := Enqueue(cmd.Context(), pool, client, projectID, parallel)
			if err != nil {
				return err
			}
			mode := ""
			if parallel {
				mode = " (parallel)"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "export job %d of project %d queued%s: River job %d (export.project)\n",
				export.ID, export.ProjectID, mode, *export.JobID)
			return nil
		},
	}
	cmd.Flags().BoolVar(&parallel, "parallel", false, "track each exported relation in project_relation_exports")
	return cmd
}
