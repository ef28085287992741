package cibuilds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/maintenance"
	"github.com/sluice-dev/sluice/settings"
)

// The sweep engine shared by the four ci.drop_*_builds kinds (GitLab's
// Ci::StuckBuilds::Drop*Service and their DropHelpers).
//
// A sweep fixes its cutoff once (the database's now() minus the kind's
// timeout setting), then pages through the builds of its status in
// (created_at, project_id, id) order, StuckBuildsBatchSize at a time, resuming
// after the key of the last build of the previous batch (keyset pagination:
// a build that could be neither dropped nor doomed is not selected again, so
// the loop always ends). For each batch it:
//
//  1. drops every build of the batch in one statement, each row only if its
//     lock_version is still the one selected and it is still stuck
//     (optimistic locking). The statement is one short transaction, the
//     batched form of GitLab's record-level transactions: it either drops
//     the rows that were untouched or, if the database rejects any row,
//     drops nothing;
//  2. handles one by one, each in its own transaction, the builds the batch
//     statement did not drop: reload, leave alone if it is gone, completed or
//     no longer stuck, else drop it with its new lock_version — at most
//     StuckBuildsMaxRetries retries after the first attempt (GitLab's
//     retry_lock(build, 3));
//  3. if the batch statement was rejected, goes through all its builds one by
//     one the same way, so that only the build the database rejects is
//     doomed: failed with data_integrity_failure by a plain UPDATE, and the
//     error logged with its build, pipeline and project ids.
//
// A run works on a connection of its own with synchronous_commit off, so
// that its hundred-odd commits do not each wait for a WAL flush (on a busy
// disk that wait is most of a run's time). Durability is not weakened where
// it matters: changes are visible to others at once, and the synchronous
// commit of the run's maintenance_runs row flushes the WAL up to it, so every
// drop of a run recorded as finished is durable. Only a crash of the server
// itself can lose the last drops of a run that is then not recorded as
// finished; those builds are still stuck and the next run drops them.

// StuckBuildsBatchSize is how many builds a sweep selects at a time.
const StuckBuildsBatchSize = 100

// StuckBuildsMaxRetries is how often a sweep reloads and retries a build whose
// lock_version moved under it, after the first attempt.
const StuckBuildsMaxRetries = 3

// Failure reasons the sweeps write to ci_builds.failure_reason.
const (
	FailureReasonStuckOrTimeout = "stuck_or_timeout_failure"
	FailureReasonStaleSchedule  = "stale_schedule"
	FailureReasonDataIntegrity  = "data_integrity_failure"
)

// Metrics are the Prometheus collectors of the stuck-build sweeps.
type Metrics struct {
	// Dropped counts builds failed by a sweep, per kind and failure_reason.
	Dropped *prometheus.CounterVec
	// Doomed counts builds whose drop the database rejected and that were
	// failed with data_integrity_failure instead, per kind.
	Doomed *prometheus.CounterVec
}

// NewMetrics creates the sweeps' metrics and registers them with reg (nil: a
// private registry).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &Metrics{
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_ci_builds_dropped_total",
			Help: "Stuck CI builds failed by the ci.drop_*_builds sweeps, per kind and failure_reason.",
		}, []string{"kind", "failure_reason"}),
		Doomed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_ci_builds_doomed_total",
			Help: "Stuck CI builds whose drop the database rejected, failed with data_integrity_failure instead, per kind.",
		}, []string{"kind"}),
	}
	for _, c := range []prometheus.Collector{m.Dropped, m.Doomed} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register ci builds metrics: %w", err)
		}
	}
	// Every sweep's series exist at 0 from the start.
	for _, s := range Sweeps() {
		m.Dropped.WithLabelValues(s.Kind, s.FailureReason)
		m.Doomed.WithLabelValues(s.Kind)
	}
	return m, nil
}

// Sweep describes one of the sweeps.
type Sweep struct {
	// Kind is the sweep's job kind.
	Kind string
	// Status is the ci_builds.status it sweeps.
	Status string
	// FailureReason is what it writes to failure_reason.
	FailureReason string
	// TimeoutSetting names the dynamic setting (a Go duration string) of
	// how old a build must be before it is failed; DefaultTimeout applies
	// when the setting is missing.
	TimeoutSetting string
	DefaultTimeout time.Duration

	// logMessage is logged when a run starts (GitLab's wording).
	logMessage string
	// Which columns must be older than the cutoff for a build to be stuck.
	createdAt, updatedAt, scheduledAt bool
	// selectBatch returns up to limit stuck builds after the key of after
	// (nil: from the start), in key order.
	selectBatch func(ctx context.Context, q *db.Queries, cutoff time.Time, after *db.CiBuild, limit int32) ([]*db.CiBuild, error)
}

// SweeperConfig configures a Sweeper.
type SweeperConfig struct {
	// Pool is the database pool; a run takes a connection of its own.
	Pool *pgxpool.Pool
	// Settings reads the timeout settings.
	Settings *settings.Settings
	// Logger receives the runs' log lines.
	Logger *slog.Logger
	// Metrics counts dropped and doomed builds (nil: a private registry).
	Metrics *Metrics
	// BeforeDrop, if set, is called before every drop attempt with the ids
	// about to be updated and the attempt number (0 for the first attempt,
	// the batch statement): tests change builds concurrently from it.
	BeforeDrop func(ctx context.Context, ids []int64, attempt int)
}

// Sweeper runs sweeps.
type Sweeper struct {
	cfg SweeperConfig
}

// NewSweeper returns a Sweeper on cfg.
func NewSweeper(cfg SweeperConfig) (*Sweeper, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Settings == nil {
		cfg.Settings = settings.New(cfg.Pool)
	}
	if cfg.Metrics == nil {
		m, err := NewMetrics(nil)
		if err != nil {
			return nil, err
		}
		cfg.Metrics = m
	}
	return &Sweeper{cfg: cfg}, nil
}

// stuckBuildsStats counts what a run did with the builds it selected.
type stuckBuildsStats struct {
	Selected int64
	Batches  int64
	Dropped  int64
	Doomed   int64
	// LeftAlone: gone, completed or no longer stuck when reloaded.
	LeftAlone int64
	// Conflicts: changed by somebody else on every attempt; the next run
	// tries again.
	Conflicts int64
	// DoomFailed: the database rejected the doom too; left as it is.
	DoomFailed int64
}

// stuckBuildsRun is one run of a sweep.
type stuckBuildsRun struct {
	sweeper *Sweeper
	sweep   *Sweep
	// conn is the run's own connection, with synchronous_commit off; q runs
	// on it.
	conn   *pgxpool.Conn
	q      *db.Queries
	cutoff time.Time
	logger *slog.Logger
	stats  stuckBuildsStats
}

// Sweep runs the sweep s once, without the maintenance framework (the
// sweep workers run it under it): the body of a maintenance run of s.
func (sw *Sweeper) Sweep(ctx context.Context, s *Sweep) (maintenance.Result, error) {
	timeout, err := sw.cfg.Settings.Duration(ctx, s.TimeoutSetting, s.DefaultTimeout)
	if err != nil {
		return maintenance.Result{}, err
	}
	if timeout <= 0 {
		return maintenance.Result{}, fmt.Errorf("setting %s: want a positive duration such as %q, got %q",
			s.TimeoutSetting, shortDuration(s.DefaultTimeout), shortDuration(timeout))
	}
	conn, err := sw.cfg.Pool.Acquire(ctx)
	if err != nil {
		return maintenance.Result{}, fmt.Errorf("acquire a connection: %w", err)
	}
	q := db.New(conn)
	syncCommit, err := q.CurrentSynchronousCommit(ctx)
	if err != nil {
		conn.Release()
		return maintenance.Result{}, fmt.Errorf("read synchronous_commit: %w", err)
	}
	defer releaseSweepConn(ctx, conn, q, syncCommit)
	if err := q.SetSynchronousCommit(ctx, "off"); err != nil {
		return maintenance.Result{}, fmt.Errorf("turn off synchronous_commit: %w", err)
	}
	now, err := q.DatabaseNow(ctx)
	if err != nil {
		return maintenance.Result{}, fmt.Errorf("read the database clock: %w", err)
	}
	run := &stuckBuildsRun{
		sweeper: sw,
		sweep:   s,
		conn:    conn,
		q:       q,
		cutoff:  now.Add(-timeout),
		logger:  sw.cfg.Logger.With("kind", s.Kind),
	}
	run.logger.Info(s.logMessage, "timeout", shortDuration(timeout), "cutoff", run.cutoff)

	err = run.run(ctx)
	st := run.stats
	return maintenance.Result{
		Affected: st.Dropped + st.Doomed,
		Details: map[string]any{
			"status":      s.Status,
			"timeout":     shortDuration(timeout),
			"cutoff":      run.cutoff,
			"selected":    st.Selected,
			"batches":     st.Batches,
			"dropped":     st.Dropped,
			"doomed":      st.Doomed,
			"left_alone":  st.LeftAlone,
			"conflicts":   st.Conflicts,
			"doom_failed": st.DoomFailed,
		},
	}, err
}

func (r *stuckBuildsRun) run(ctx context.Context) error {
	var after *db.CiBuild
	for {
		builds, err := r.sweep.selectBatch(ctx, r.q, r.cutoff, after, StuckBuildsBatchSize)
		if err != nil {
			return fmt.Errorf("select stuck %s builds: %w", r.sweep.Status, err)
		}
		if len(builds) == 0 {
			return nil
		}
		r.stats.Batches++
		r.stats.Selected += int64(len(builds))
		after = builds[len(builds)-1]
		if err := r.dropBatch(ctx, builds); err != nil {
			return err
		}
	}
}

// dropBatch drops the builds of one batch: all at once where nobody changed
// them, then one by one the rest (or all of them, if the database rejected
// the batch statement).
func (r *stuckBuildsRun) dropBatch(ctx context.Context, builds []*db.CiBuild) error {
	ids := make([]int64, len(builds))
	versions := make([]int32, len(builds))
	for i, b := range builds {
		ids[i] = b.ID
		versions[i] = b.LockVersion
	}
	r.callHook(ctx, ids, 0)
	dropped, err := r.q.DropStuckBuilds(ctx, r.dropParams(ids, versions))
	if err != nil {
		if !isBuildRejection(err) && !isRetryableConflict(err) {
			return fmt.Errorf("drop a batch of stuck %s builds: %w", r.sweep.Status, err)
		}
		r.logger.Warn("batch drop rejected by the database; dropping its builds one by one",
			"error", err, "builds", len(builds))
		for _, b := range builds {
			if err := r.dropOne(ctx, b, 0); err != nil {
				return err
			}
		}
		return nil
	}
	done := make(map[int64]bool, len(dropped))
	for _, id := range dropped {
		done[id] = true
	}
	for _, b := range builds {
		if done[b.ID] {
			r.recordDrop(b)
			continue
		}
		// Changed since the select: reload and retry.
		if err := r.dropOne(ctx, b, 1); err != nil {
			return err
		}
	}
	return nil
}

// dropOne drops one build in its own transaction, starting at attempt (0:
// with the row as selected; above 0: a retry, which reloads the row first).
// It returns an error only when the run cannot go on (lost connection,
// cancelled context); whatever happens to the build is counted.
func (r *stuckBuildsRun) dropOne(ctx context.Context, b *db.CiBuild, attempt int) error {
	for ; ; attempt++ {
		if attempt > 0 {
			cur, err := r.q.GetCIBuild(ctx, b.ID)
			if errors.Is(err, pgx.ErrNoRows) {
				r.stats.LeftAlone++
				r.logger.Info("Build gone before it could be dropped", "build_id", b.ID)
				return nil
			}
			if err != nil {
				return fmt.Errorf("reload build %d: %w", b.ID, err)
			}
			if !r.stuck(cur) {
				r.stats.LeftAlone++
				r.logger.Info("Build changed and is no longer stuck; left alone",
					"build_id", cur.ID, "status", cur.Status, "lock_version", cur.LockVersion)
				return nil
			}
			b = cur
		}
		if attempt > StuckBuildsMaxRetries {
			r.stats.Conflicts++
			r.logger.Warn("Build changed concurrently on every attempt; left for the next run",
				"build_id", b.ID, "attempts", attempt)
			return nil
		}
		r.callHook(ctx, []int64{b.ID}, attempt)
		dropped, err := r.q.DropStuckBuilds(ctx, r.dropParams([]int64{b.ID}, []int32{b.LockVersion}))
		switch {
		case err == nil && len(dropped) == 1:
			r.recordDrop(b)
			return nil
		case err == nil, isRetryableConflict(err):
			// lock_version moved (or the build stopped being stuck): retry.
		case isBuildRejection(err):
			return r.doom(ctx, b, err)
		default:
			return fmt.Errorf("drop build %d: %w", b.ID, err)
		}
	}
}

// doom is the fallback when the database rejected the drop of b: fail it
// with data_integrity_failure by a plain UPDATE; if that is rejected too,
// once more with ordinary triggers and rules disabled for the transaction
// (when the database role may do that).
func (r *stuckBuildsRun) doom(ctx context.Context, b *db.CiBuild, dropErr error) error {
	logger := r.logger.With("build_id", b.ID, "pipeline_id", deref(b.PipelineID), "project_id", b.ProjectID,
		"build_name", b.Name, "build_stage", b.Stage)
	logger.Error("Dropping build failed; dooming it", "error", dropErr)

	n, err := r.q.DoomCIBuild(ctx, db.DoomCIBuildParams{ID: b.ID, Status: r.sweep.Status})
	if err != nil && isBuildRejection(err) {
		plainErr := err
		n, err = r.doomBypassingTriggers(ctx, b)
		if err != nil && isBuildRejection(err) {
			err = fmt.Errorf("%w; with triggers disabled: %w", plainErr, err)
		}
	}
	switch {
	case err != nil && (isBuildRejection(err) || isRetryableConflict(err)):
		r.stats.DoomFailed++
		logger.Error("Dooming build failed; left as it is", "error", err)
		return nil
	case err != nil:
		return fmt.Errorf("doom build %d: %w", b.ID, err)
	case n == 0:
		r.stats.LeftAlone++
		logger.Info("Build left its status before it could be doomed; left alone")
		return nil
	}
	r.stats.Doomed++
	r.sweeper.cfg.Metrics.Doomed.WithLabelValues(r.sweep.Kind).Inc()
	logger.Warn("Build doomed", "failure_reason", FailureReasonDataIntegrity)
	return nil
}

func (r *stuckBuildsRun) doomBypassingTriggers(ctx context.Context, b *db.CiBuild) (int64, error) {
	tx, err := r.conn.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	q := r.q.WithTx(tx)
	if err := q.BypassTriggersForTransaction(ctx); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			// Not allowed to (insufficient privilege): the doom stays
			// rejected.
			return 0, &buildRejectedError{fmt.Errorf("disable triggers: %w", err)}
		}
		return 0, err
	}
	n, err := q.DoomCIBuild(ctx, db.DoomCIBuildParams{ID: b.ID, Status: r.sweep.Status})
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	return n, nil
}

// releaseSweepConn restores synchronous_commit on the run's connection and
// returns it to the pool, or closes it if that fails.
func releaseSweepConn(ctx context.Context, conn *pgxpool.Conn, q *db.Queries, syncCommit string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := q.SetSynchronousCommit(ctx, syncCommit); err != nil {
		_ = conn.Hijack().Close(ctx)
		return
	}
	conn.Release()
}

func (r *stuckBuildsRun) recordDrop(b *db.CiBuild) {
	r.stats.Dropped++
	r.sweeper.cfg.Metrics.Dropped.WithLabelValues(r.sweep.Kind, r.sweep.FailureReason).Inc()
	r.logger.Info("Dropping outdated build", "build_id", b.ID, "runner_id", deref(b.RunnerID),
		"status", b.Status, "failure_reason", r.sweep.FailureReason)
}

// stuck reports whether b is still stuck by the run's rules (the same as the
// WHERE clauses of the select and of DropStuckBuilds).
func (r *stuckBuildsRun) stuck(b *db.CiBuild) bool {
	s := r.sweep
	return b.Status == s.Status &&
		(!s.createdAt || b.CreatedAt.Before(r.cutoff)) &&
		(!s.updatedAt || b.UpdatedAt.Before(r.cutoff)) &&
		(!s.scheduledAt || (b.ScheduledAt != nil && b.ScheduledAt.Before(r.cutoff)))
}

func (r *stuckBuildsRun) dropParams(ids []int64, versions []int32) db.DropStuckBuildsParams {
	p := db.DropStuckBuildsParams{
		FailureReason: r.sweep.FailureReason,
		Status:        r.sweep.Status,
		Ids:           ids,
		LockVersions:  versions,
	}
	cutoff := r.cutoff
	if r.sweep.createdAt {
		p.CreatedBefore = &cutoff
	}
	if r.sweep.updatedAt {
		p.UpdatedBefore = &cutoff
	}
	if r.sweep.scheduledAt {
		p.ScheduledBefore = &cutoff
	}
	return p
}

func (r *stuckBuildsRun) callHook(ctx context.Context, ids []int64, attempt int) {
	if r.sweeper.cfg.BeforeDrop != nil {
		r.sweeper.cfg.BeforeDrop(ctx, ids, attempt)
	}
}

// keyset returns the keyset arguments after b (all nil for the first batch).
func keyset(after *db.CiBuild) (*time.Time, *int64, *int64) {
	if after == nil {
		return nil, nil, nil
	}
	return &after.CreatedAt, &after.ProjectID, &after.ID
}

// buildRejectedError marks an error as the database rejecting a build's
// update, whatever its SQLSTATE.
type buildRejectedError struct{ err error }

func (e *buildRejectedError) Error() string { return e.err.Error() }

func (e *buildRejectedError) Unwrap() error { return e.err }

// isRetryableConflict reports errors that mean "somebody else holds or
// changed the row right now": serialization failures, deadlocks, lock
// timeouts. They count as an optimistic-lock conflict.
func isRetryableConflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (sqlstateClass(pgErr.Code) == "40" || pgErr.Code == "55P03")
}

// isBuildRejection reports whether err is the database rejecting the update
// of a build because of the build (constraint, trigger, data exception, …),
// as opposed to a problem of the connection, the server or the schema, which
// would hit every build and ends the run instead.
func isBuildRejection(err error) bool {
	var rejected *buildRejectedError
	if errors.As(err, &rejected) {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || isRetryableConflict(err) {
		return false
	}
	switch sqlstateClass(pgErr.Code) {
	case "08", // connection exception
		"25", // invalid transaction state (such as a read-only server)
		"42", // missing table or privilege: the same for every build
		"53", // insufficient resources
		"57", // operator intervention (query cancelled, shutdown)
		"58", // system error
		"F0", // configuration file error
		"XX": // internal error
		return false
	}
	return true
}

// sqlstateClass is the class (first two characters) of a SQLSTATE code.
func sqlstateClass(code string) string {
	if len(code) < 2 {
		return code
	}
	return code[:2]
}

// shortDuration formats d without zero minutes and seconds: "1h", "24h",
// "1h30m", as operators write the settings.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// deref returns *p, or nil, for log attributes.
func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
