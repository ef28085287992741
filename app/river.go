package app

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/sluice-dev/sluice/db"
)

// Client is the River client type sluice uses.
type Client = river.Client[pgx.Tx]

// NewInsertClient returns a River client that only inserts and cancels jobs
// (no queues, no workers), for CLI commands.
func NewInsertClient(pool *pgxpool.Pool) (*Client, error) {
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: db.SchemasOf(pool).River})
	if err != nil {
		return nil, fmt.Errorf("create River client: %w", err)
	}
	return client, nil
}

type clientOpts struct {
	fetchCooldown        time.Duration
	fetchPollInterval    time.Duration
	rescueStuckJobsAfter time.Duration
	id                   string
	queues               map[string]river.QueueConfig
	jobTimeout           time.Duration
	leaderElectionOff    bool
	softStopTimeout      time.Duration
}

// newWorkClient builds a River client working the program's jobs, with
// sluice's middleware, and gives it to the workers that insert jobs.
func newWorkClient(pool *pgxpool.Pool, j *Jobs, logger *slog.Logger, opts clientOpts) (*Client, error) {
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		FetchCooldown:          opts.fetchCooldown,
		FetchPollInterval:      opts.fetchPollInterval,
		ID:                     opts.id,
		RescueStuckJobsAfter:   opts.rescueStuckJobsAfter,
		Schema:                 db.SchemasOf(pool).River,
		JobTimeout:             opts.jobTimeout,
		LeaderElectionDisabled: opts.leaderElectionOff,
		Logger:                 logger,
		Queues:                 opts.queues,
		SoftStopTimeout:        opts.softStopTimeout,
		WorkerMiddleware:       j.Middleware(),
		Workers:                j.Workers,
	})
	if err != nil {
		return nil, fmt.Errorf("create River client: %w", err)
	}
	j.SetClient(client)
	return client, nil
}
