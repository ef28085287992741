package app

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/sluice-dev/sluice/jobs"
)

// Client is the River client type sluice uses.
type Client = river.Client[pgx.Tx]

// NewInsertClient returns a River client that only inserts and cancels jobs
// (no queues, no workers), for CLI commands.
func NewInsertClient(pool *pgxpool.Pool) (*Client, error) {
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
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

// newWorkClient builds a River client with every sluice worker and
// middleware registered.
func newWorkClient(pool *pgxpool.Pool, deps *jobs.Deps, opts clientOpts) (*Client, error) {
	workers := river.NewWorkers()
	if err := jobs.AddWorkers(workers, deps); err != nil {
		return nil, fmt.Errorf("register workers: %w", err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		FetchCooldown:          opts.fetchCooldown,
		FetchPollInterval:      opts.fetchPollInterval,
		ID:                     opts.id,
		RescueStuckJobsAfter:   opts.rescueStuckJobsAfter,
		JobTimeout:             opts.jobTimeout,
		LeaderElectionDisabled: opts.leaderElectionOff,
		Logger:                 deps.Logger,
		Queues:                 opts.queues,
		SoftStopTimeout:        opts.softStopTimeout,
		WorkerMiddleware:       jobs.Middleware(deps),
		Workers:                workers,
	})
	if err != nil {
		return nil, fmt.Errorf("create River client: %w", err)
	}
	return client, nil
}
