package exports

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/sluice-dev/sluice/db"
)

// Statuses of project_export_jobs and project_relation_exports.
const (
	ExportQueued   = "queued"
	ExportStarted  = "started"
	ExportFinished = "finished"
	ExportFailed   = "failed"
)

// Relations of a project export, in archive order: the project itself (one
// record, GitLab's root relation) and its CI builds.
const (
	RelationProject  = "project"
	RelationCIBuilds = "ci_builds"
)

// ExportRelations lists the relations export.project writes, in archive
// order; a parallel export has one project_relation_exports row for each.
func ExportRelations() []string { return []string{RelationProject, RelationCIBuilds} }

// DefaultDir is where export.project writes archives unless
// SLUICE_EXPORT_DIR (Deps.ExportDir) says otherwise; relative to the working
// directory of the process.
const DefaultDir = "./exports"

// ExportProjectMaxAttempts is how often River tries an export: an attempt
// that fails (or whose process dies) is retried from scratch; after the last
// one the export is failed.
const ExportProjectMaxAttempts = 3

// ExportProjectTimeout bounds one export attempt. It stays below River's
// rescue delay (1 hour), so a live attempt is never rescued as stuck.
const ExportProjectTimeout = 30 * time.Minute

// exportPageSize is how many ci_builds the export reads per query.
const exportPageSize = 1000

// ExportArchiveName is the file name of the archive of export exportJobID of
// projectID in the export directory.
func ExportArchiveName(projectID, exportJobID int64) string {
	return fmt.Sprintf("project-%d-export-%d.ndjson.gz", projectID, exportJobID)
}

// ExportLine is one line of an export archive: a record of a relation.
type ExportLine struct {
	// Relation is RelationProject or RelationCIBuilds.
	Relation string `json:"relation"`
	// Record is the relation's record: ExportProjectRecord or a ci_builds row.
	Record json.RawMessage `json:"record"`
}

// ExportProjectRecord is the record of the project relation, the archive's
// first line.
type ExportProjectRecord struct {
	ProjectID   int64     `json:"project_id"`
	ExportJobID int64     `json:"export_job_id"`
	ExportedAt  time.Time `json:"exported_at"`
}

// ProjectArgs are the args of export.project.
type ProjectArgs struct {
	// ExportJobID is the project_export_jobs row to work.
	ExportJobID int64 `json:"export_job_id"`
}

// Kind is the River job kind.
func (ProjectArgs) Kind() string { return "export.project" }

// Validate checks that export_job_id names a row.
func (a ProjectArgs) Validate() error {
	if a.ExportJobID <= 0 {
		return fmt.Errorf("field \"export_job_id\": must be a positive export job id, got %d", a.ExportJobID)
	}
	return nil
}

// InsertOpts limits the attempts of an export.
func (ProjectArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: ExportProjectMaxAttempts}
}

// ProjectWorker works export.project: it writes a gzip'd NDJSON archive
// of a project's ci_builds (GitLab's ProjectExportWorker).
//
// An attempt looks at its project_export_jobs row first:
//   - missing: the job is cancelled (nothing to export; not retried);
//   - finished or failed: nothing to do, the job completes (a duplicate or
//     late job changes nothing);
//   - pointing at another River job: the job is cancelled (that job owns the
//     export);
//   - queued, or started (a retry after a failed or crashed attempt): the row
//     is marked started (claiming it if its job_id is NULL) and the export is
//     done from scratch.
//
// The archive is written to a temporary file in the export directory and
// renamed to ExportArchiveName when complete, so the archive is never seen
// half written; the row is marked finished in the transaction that completes
// the River job. An attempt that fails records its error on the row and is
// retried; after the last attempt the row is marked failed. An attempt
// cancelled with `sluice jobs cancel` fails the row at once.
type ProjectWorker struct {
	river.WorkerDefaults[ProjectArgs]
	deps *deps
}

// Timeout bounds one attempt.
func (w *ProjectWorker) Timeout(*river.Job[ProjectArgs]) time.Duration {
	return ExportProjectTimeout
}

// Work exports the project of the job's export row.
func (w *ProjectWorker) Work(ctx context.Context, job *river.Job[ProjectArgs]) error {
	id := job.Args.ExportJobID
	logger := w.deps.Logger.With("kind", job.Kind, "job_id", job.ID, "export_job_id", id, "attempt", job.Attempt)

	export, err := w.start(ctx, job)
	if err != nil || export == nil {
		return err
	}
	logger = logger.With("project_id", export.ProjectID)
	logger.Info("project export started", "parallel", export.Parallel)

	path, counts, err := w.writeArchive(ctx, export)
	if err != nil {
		return w.fail(ctx, logger, job, err)
	}
	finished, err := w.finish(ctx, job, export, path, counts)
	if err != nil {
		// The archive stays: a retry overwrites it, and it may even be
		// committed if only the commit's answer was lost.
		return w.fail(ctx, logger, job, err)
	}
	if !finished {
		// Someone else ended the export while this attempt wrote it (an
		// operator, by SQL): their word stands, the archive goes.
		_ = os.Remove(path)
		logger.Warn("project export ended elsewhere during the attempt: archive discarded")
		return river.JobCancel(fmt.Errorf("export job %d was no longer started by River job %d when its archive was complete", id, job.ID))
	}
	w.deps.Metrics.Exports.WithLabelValues(ExportFinished).Inc()
	logger.Info("project export finished", "archive", path, "records", counts.total())
	return nil
}

// start marks the export row started by job, or returns a nil row (and
// possibly a JobCancel error) when there is nothing for the job to do.
func (w *ProjectWorker) start(ctx context.Context, job *river.Job[ProjectArgs]) (*db.ProjectExportJob, error) {
	id := job.Args.ExportJobID
	logger := w.deps.Logger.With("kind", job.Kind, "job_id", job.ID, "export_job_id", id)
	tx, err := w.deps.Pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("export job %d: begin: %w", id, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	q := w.deps.Queries.WithTx(tx)

	row, err := q.LockProjectExportJob(ctx, id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		logger.Warn("project export skipped: no such export job")
		return nil, river.JobCancel(fmt.Errorf("export job %d does not exist", id))
	case err != nil:
		return nil, fmt.Errorf("export job %d: read: %w", id, err)
	case row.Status == ExportFinished || row.Status == ExportFailed:
		logger.Info("project export skipped: already " + row.Status)
		return nil, nil
	case row.JobID != nil && *row.JobID != job.ID:
		logger.Warn("project export skipped: the export belongs to another River job", "owner_job_id", *row.JobID)
		return nil, river.JobCancel(fmt.Errorf("export job %d belongs to River job %d", id, *row.JobID))
	}
	if row.Status == ExportStarted {
		logger.Info("project export restarting after an interrupted attempt", "attempt", job.Attempt, "last_error", row.Error)
	}
	row, err = q.StartProjectExportJob(ctx, db.StartProjectExportJobParams{ID: id, JobID: &job.ID})
	if err != nil {
		return nil, fmt.Errorf("export job %d: mark started: %w", id, err)
	}
	if row.Parallel {
		if err := q.StartRelationExports(ctx, db.StartRelationExportsParams{
			ProjectExportJobID: id, Relations: ExportRelations(),
		}); err != nil {
			return nil, fmt.Errorf("export job %d: start relation exports: %w", id, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("export job %d: commit start: %w", id, err)
	}
	return row, nil
}

// relationCounts is the number of records written per relation.
type relationCounts map[string]int64

func (c relationCounts) total() int64 {
	var n int64
	for _, v := range c {
		n += v
	}
	return n
}

// writeArchive writes the archive of export atomically and returns its path.
// The records come from one snapshot (a repeatable-read transaction), so the
// archive is consistent however long it takes.
func (w *ProjectWorker) writeArchive(ctx context.Context, export *db.ProjectExportJob) (path string, counts relationCounts, err error) {
	dir := w.deps.exportDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, fmt.Errorf("create export directory: %w", err)
	}
	name := ExportArchiveName(export.ProjectID, export.ID)
	final := filepath.Join(dir, name)
	if abs, err := filepath.Abs(final); err == nil {
		final = abs
	}
	tmpPattern := "." + name + ".tmp-*"
	// Leftovers of earlier attempts of this export that died mid-write.
	if stale, _ := filepath.Glob(filepath.Join(dir, tmpPattern)); len(stale) > 0 {
		for _, p := range stale {
			_ = os.Remove(p)
		}
	}
	f, err := os.CreateTemp(dir, tmpPattern)
	if err != nil {
		return "", nil, fmt.Errorf("create archive: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()

	buf := bufio.NewWriterSize(f, 64<<10)
	gz := gzip.NewWriter(buf)
	counts, err = w.writeRecords(ctx, gz, export)
	if err != nil {
		return "", nil, err
	}
	if err = gz.Close(); err != nil {
		return "", nil, fmt.Errorf("write archive: %w", err)
	}
	if err = buf.Flush(); err != nil {
		return "", nil, fmt.Errorf("write archive: %w", err)
	}
	if err = f.Sync(); err != nil {
		return "", nil, fmt.Errorf("sync archive: %w", err)
	}
	if err = f.Close(); err != nil {
		return "", nil, fmt.Errorf("close archive: %w", err)
	}
	if err = os.Chmod(tmp, 0o644); err != nil {
		return "", nil, fmt.Errorf("archive permissions: %w", err)
	}
	if err = os.Rename(tmp, final); err != nil {
		return "", nil, fmt.Errorf("publish archive: %w", err)
	}
	syncDir(dir)
	return final, counts, nil
}

// writeRecords writes the project record and the project's ci_builds as
// NDJSON lines.
func (w *ProjectWorker) writeRecords(ctx context.Context, out *gzip.Writer, export *db.ProjectExportJob) (relationCounts, error) {
	tx, err := w.deps.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("read project %d: begin: %w", export.ProjectID, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	q := w.deps.Queries.WithTx(tx)

	enc := json.NewEncoder(out)
	writeLine := func(relation string, record any) error {
		raw, err := json.Marshal(record)
		if err != nil {
			return fmt.Errorf("encode %s record: %w", relation, err)
		}
		if err := enc.Encode(ExportLine{Relation: relation, Record: raw}); err != nil {
			return fmt.Errorf("write archive: %w", err)
		}
		return nil
	}

	counts := relationCounts{}
	if err := writeLine(RelationProject, ExportProjectRecord{
		ProjectID: export.ProjectID, ExportJobID: export.ID, ExportedAt: time.Now().UTC(),
	}); err != nil {
		return nil, err
	}
	counts[RelationProject] = 1

	counts[RelationCIBuilds] = 0
	var after int64
	for {
		page, err := q.ExportBuildsPage(ctx, db.ExportBuildsPageParams{
			ProjectID: export.ProjectID, AfterID: after, MaxRows: exportPageSize,
		})
		if err != nil {
			return nil, fmt.Errorf("read ci_builds of project %d: %w", export.ProjectID, err)
		}
		for _, b := range page {
			if err := writeLine(RelationCIBuilds, b); err != nil {
				return nil, err
			}
		}
		counts[RelationCIBuilds] += int64(len(page))
		if len(page) < exportPageSize {
			return counts, nil
		}
		after = page[len(page)-1].ID
	}
}

// finish marks the export finished (and its relation exports) in the
// transaction that completes the River job. It reports false, changing
// nothing, when the row is no longer started by this job.
func (w *ProjectWorker) finish(ctx context.Context, job *river.Job[ProjectArgs], export *db.ProjectExportJob, path string, counts relationCounts) (bool, error) {
	tx, err := w.deps.Pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("export job %d: begin finish: %w", export.ID, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	q := w.deps.Queries.WithTx(tx)
	_, err = q.FinishProjectExportJob(ctx, db.FinishProjectExportJobParams{
		ID: export.ID, JobID: &job.ID, ArchivePath: &path, Records: ptr(counts.total()),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("export job %d: mark finished: %w", export.ID, err)
	}
	if export.Parallel {
		relations := ExportRelations()
		records := make([]int64, len(relations))
		for i, r := range relations {
			records[i] = counts[r]
		}
		if err := q.FinishRelationExports(ctx, db.FinishRelationExportsParams{
			ProjectExportJobID: export.ID, Relations: relations, Records: records,
		}); err != nil {
			return false, fmt.Errorf("export job %d: finish relation exports: %w", export.ID, err)
		}
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return false, fmt.Errorf("export job %d: complete River job: %w", export.ID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("export job %d: commit finish: %w", export.ID, err)
	}
	return true, nil
}

// fail handles a failed attempt: the error is recorded on the row and River
// retries, unless this was the last attempt or the job was cancelled, which
// fail the export.
func (w *ProjectWorker) fail(ctx context.Context, logger *slog.Logger, job *river.Job[ProjectArgs], cause error) error {
	id := job.Args.ExportJobID
	cancelled := errors.Is(context.Cause(ctx), river.ErrJobCancelledRemotely)
	// The row must record the outcome even when ctx is done (timeout, cancel).
	bg, stop := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer stop()
	msg := cause.Error()
	if cancelled {
		msg = "cancelled: " + msg
	}
	if job.Attempt < job.MaxAttempts && !cancelled {
		if err := w.deps.Queries.RecordProjectExportError(bg, db.RecordProjectExportErrorParams{
			ID: id, JobID: &job.ID, Error: &msg,
		}); err != nil {
			logger.Error("project export error not recorded", "error", err)
		}
		logger.Warn("project export attempt failed; River will retry it", "error", msg, "max_attempts", job.MaxAttempts)
		return cause
	}
	n, err := w.deps.Queries.FailProjectExportJob(bg, db.FailProjectExportJobParams{ID: id, JobID: &job.ID, Error: &msg})
	if err != nil {
		logger.Error("project export failure not recorded", "error", err, "export_error", msg)
		return cause
	}
	if n > 0 {
		w.deps.Metrics.Exports.WithLabelValues(ExportFailed).Inc()
	}
	logger.Error("project export failed", "error", msg)
	return cause
}

// syncDir makes a rename in dir durable (best effort: not every platform can
// sync a directory).
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
}

func ptr[T any](v T) *T { return &v }

// Enqueue starts an export of projectID: it inserts the
// project_export_jobs row (queued) and its export.project River job in one
// transaction and records the River job's id in the row's job_id.
func Enqueue(ctx context.Context, pool *pgxpool.Pool, client *river.Client[pgx.Tx], projectID int64, parallel bool) (*db.ProjectExportJob, error) {
	if projectID <= 0 {
		return nil, fmt.Errorf("project id must be positive, got %d", projectID)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("start export of project %d: begin: %w", projectID, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	q := db.New(tx)
	export, err := q.CreateProjectExportJob(ctx, db.CreateProjectExportJobParams{ProjectID: projectID, Parallel: parallel})
	if err != nil {
		return nil, fmt.Errorf("start export of project %d: insert export job: %w", projectID, err)
	}
	res, err := client.InsertTx(ctx, tx, ProjectArgs{ExportJobID: export.ID}, nil)
	if err != nil {
		return nil, fmt.Errorf("start export of project %d: insert export.project job: %w", projectID, err)
	}
	if err := q.SetProjectExportJobID(ctx, db.SetProjectExportJobIDParams{ID: export.ID, JobID: &res.Job.ID}); err != nil {
		return nil, fmt.Errorf("start export of project %d: record River job: %w", projectID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("start export of project %d: commit: %w", projectID, err)
	}
	export.JobID = &res.Job.ID
	return export, nil
}
