// Command greeter is a sluice program with one job kind of its own,
// greeter.greet, which writes a row to the application's own greetings
// table. It is the whole sluice command line (migrate, worker, enqueue,
// run, schedule, limits, ...) with greeter.greet known to every command:
//
//	export DATABASE_URL=postgres://postgres@127.0.0.1:5432/greeter
//	go run ./examples/greeter migrate up
//	go run ./examples/greeter enqueue greeter.greet --args '{"name": "ada"}'
//	go run ./examples/greeter worker
//
// Its migration (migrations/00001_greetings.sql) creates the greetings table
// and a schedule that greets "cron" every second.
package main

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice"
)

// GreetArgs are the args of a greeter.greet job.
type GreetArgs struct {
	// Name is who to greet.
	Name string `json:"name"`
}

// Kind is the River job kind.
func (GreetArgs) Kind() string { return "greeter.greet" }

// Validate rejects an empty name. sluice's enqueue, run and schedule call it
// on the args they decode, and refuse bad args (exit 2) before anything is
// written; the error names the field.
func (a GreetArgs) Validate() error {
	if a.Name == "" {
		return errors.New(`field "name": required`)
	}
	return nil
}

// GreetWorker works greeter.greet jobs: a plain River worker.
//
// It writes with a pool of its own, opened from DATABASE_URL, as a River
// worker usually holds the pool it needs: sluice keeps its own pool to
// itself (its connections have sluice's schema first on their search_path
// and carry the worker's identity). This pool has the connection string's
// own search_path, the one the application's migrations ran with, so
// "greetings" is the table they created. The insert is not in the
// transaction that completes the job (River's JobCompleteTx would need a
// transaction on sluice's pool: sluice fences the completions of a worker
// that was declared dead on its own connections only), so a job retried
// after its insert greets twice; make the write idempotent where that
// matters.
type GreetWorker struct {
	river.WorkerDefaults[GreetArgs]
	pool *pgxpool.Pool
}

// Work inserts the greeting.
func (w *GreetWorker) Work(ctx context.Context, job *river.Job[GreetArgs]) error {
	_, err := w.pool.Exec(ctx, "INSERT INTO greetings (name) VALUES ($1)", job.Args.Name)
	return err
}

// migrations are the greeter's own goose migrations, applied by
// `greeter migrate up` after River's and sluice's.
//
//go:embed migrations/*.sql
var embedded embed.FS

func main() {
	// pgxpool.New connects lazily: commands that work no jobs never use it.
	// The greeter reads its database from DATABASE_URL only; sluice also
	// takes --database-url, which this pool does not see.
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "greeter: %v\n", err)
		os.Exit(2)
	}

	migrationsFS, err := fs.Sub(embedded, "migrations")
	if err != nil {
		panic(err)
	}

	workers := river.NewWorkers()
	river.AddWorker(workers, &GreetWorker{pool: pool})

	// No sluice modules are turned on: a library user opts in per module
	// with Config.Modules (modules.All(), or cibuilds.Module(),
	// exports.Module(exports.Config{}), taskcancel.Module(), demo.Module()).
	// sluice's core (schedules, concurrency limits, liveness, metrics,
	// health) is always on.
	os.Exit(sluice.Main(sluice.Config{Workers: workers, Migrations: migrationsFS}))
}
