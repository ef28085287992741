package sluice_test

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/modules/demo"
)

// GreetArgs are the args of an application's own job kind.
type GreetArgs struct {
	// Name is who to greet.
	Name string `json:"name"`
}

// Kind is the River job kind.
func (GreetArgs) Kind() string { return "greet" }

// Validate rejects an empty name: sluice's enqueue, run and schedule call it
// on the args they decode.
func (a GreetArgs) Validate() error {
	if a.Name == "" {
		return fmt.Errorf(`field "name": required`)
	}
	return nil
}

// GreetWorker works greet jobs: a plain River worker.
type GreetWorker struct {
	river.WorkerDefaults[GreetArgs]
}

func (w *GreetWorker) Work(ctx context.Context, job *river.Job[GreetArgs]) error {
	fmt.Printf("Hello, %s!\n", job.Args.Name)
	return nil
}

// Example runs a sluice worker inside an application's own process: the
// application registers its River workers, New builds the worker on a
// migrated database, and the worker's River client inserts jobs for it.
func Example() {
	ctx := context.Background()

	// A fresh database migrated with `sluice migrate up`; an application
	// passes its own.
	databaseURL, dropDatabase := testdb.NewForExample()
	defer dropDatabase()

	workers := river.NewWorkers()
	river.AddWorker(workers, &GreetWorker{})

	w, err := sluice.New(ctx, sluice.Config{
		DatabaseURL: databaseURL,
		Workers:     workers,
	})
	if err != nil {
		panic(err)
	}

	// Out of example scope, but used to wait until the job is worked.
	completed, cancel := w.Client().Subscribe(river.EventKindJobCompleted)
	defer cancel()

	if err := w.Start(ctx); err != nil {
		panic(err)
	}

	res, err := w.Client().Insert(ctx, GreetArgs{Name: "Ada"}, nil)
	if err != nil {
		panic(err)
	}

	select {
	case ev := <-completed:
		fmt.Printf("job %s: %s\n", ev.Job.Kind, ev.Job.State)
		if ev.Job.ID != res.Job.ID {
			panic("completed a job that was not inserted")
		}
	case <-time.After(30 * time.Second):
		panic("job not completed within 30 seconds")
	}

	if err := w.Stop(ctx); err != nil {
		panic(err)
	}

	// Output:
	// Hello, Ada!
	// job greet: completed
}

// SleepKindArgs are an application's args that claim demo.sleep, the kind
// of the demo module.
type SleepKindArgs struct{}

func (SleepKindArgs) Kind() string { return "demo.sleep" }

// ExampleNew_kindRegisteredTwice shows New refusing a program with a kind
// registered twice: by the application and by a module it turns on.
func ExampleNew_kindRegisteredTwice() {
	ctx := context.Background()

	databaseURL, dropDatabase := testdb.NewForExample()
	defer dropDatabase()

	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, job *river.Job[SleepKindArgs]) error {
		return nil
	}))

	_, err := sluice.New(ctx, sluice.Config{
		DatabaseURL: databaseURL,
		Workers:     workers,
		Modules:     []sluice.Module{demo.Module()},
	})
	fmt.Println(err)

	// Output:
	// sluice: job kind "demo.sleep" is registered twice (Config.Workers and module demo)
}
