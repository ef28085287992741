package app_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/module"
	"github.com/sluice-dev/sluice/modules"
	"github.com/sluice-dev/sluice/modules/demo"
)

// userArgs is an application's own kind.
type userArgs struct {
	Name string `json:"name"`
}

func (userArgs) Kind() string { return "user.greet" }

// userSleepArgs is an application kind that takes demo.sleep's name.
type userSleepArgs struct{}

func (userSleepArgs) Kind() string { return "demo.sleep" }

// userResumeArgs is an application kind that takes the core's kind.
type userResumeArgs struct{}

func (userResumeArgs) Kind() string { return limiter.ResumeKind }

// userAliasArgs is an application kind renamed from demo.sleep's name.
type userAliasArgs struct{}

func (userAliasArgs) Kind() string          { return "user.nap" }
func (userAliasArgs) KindAliases() []string { return []string{"demo.sleep"} }

// undeclaredArgs is a kind no module declares.
type undeclaredArgs struct{}

func (undeclaredArgs) Kind() string { return "rogue.undeclared" }

func noop[T river.JobArgs]() river.Worker[T] {
	return river.WorkFunc(func(context.Context, *river.Job[T]) error { return nil })
}

// bundleOf returns a bundle with a no-op worker for each kind added by add.
func bundleOf(adds ...func(*river.Workers)) *river.Workers {
	workers := river.NewWorkers()
	for _, add := range adds {
		add(workers)
	}
	return workers
}

func withWorker[T river.JobArgs](workers *river.Workers) { river.AddWorker(workers, noop[T]()) }

func TestProgramRegistry(t *testing.T) {
	t.Parallel()

	r, err := app.Program{Workers: bundleOf(withWorker[userArgs], withWorker[userAliasArgs])}.Registry()
	require.NoError(t, err)
	require.Equal(t, []string{"concurrency_limit.resume", "demo.sleep", "user.greet", "user.nap"}, r.Names(),
		"the application's kinds (an alias too) and the core's, without modules")
	args, err := r.Decode("user.greet", []byte(`{"name": "ada"}`))
	require.NoError(t, err)
	require.Equal(t, userArgs{Name: "ada"}, args)

	r, err = app.Program{Modules: []module.Module{demo.Module()}}.Registry()
	require.NoError(t, err)
	require.Equal(t, []string{"concurrency_limit.resume", "demo.sleep"}, r.Names(), "a module without application workers")

	r, err = app.Program{Workers: bundleOf(withWorker[userArgs]), Modules: modules.All()}.Registry()
	require.NoError(t, err)
	require.True(t, r.Has("user.greet"))
	require.True(t, r.Has("demo.sleep"))
	require.True(t, r.Has(limiter.ResumeKind))
	for _, m := range modules.All() {
		for _, k := range m.Kinds {
			require.True(t, r.Has(k.Name), "module %s kind %s", m.Name, k.Name)
		}
	}
}

func TestProgramRegistryNothingToWork(t *testing.T) {
	t.Parallel()

	for name, p := range map[string]app.Program{
		"zero":                    {},
		"empty bundle":            {Workers: river.NewWorkers()},
		"empty module list":       {Modules: []module.Module{}},
		"empty bundle, no module": {Workers: river.NewWorkers(), Modules: []module.Module{}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, err := p.Registry()
			require.Nil(t, r)
			require.ErrorIs(t, err, app.ErrNothingToWork)
			require.ErrorContains(t, err, "nothing to work")
		})
	}
}

func TestProgramRegistryDuplicateKind(t *testing.T) {
	t.Parallel()

	otherSleep := module.Module{Name: "other", Kinds: []kinds.Kind{kinds.Of[userSleepArgs]()}}
	coreClash := module.Module{Name: "clash", Kinds: []kinds.Kind{kinds.Of[userResumeArgs]()}}

	for _, tc := range []struct {
		name string
		p    app.Program
		want string
	}{
		{
			"application and module",
			app.Program{Workers: bundleOf(withWorker[userSleepArgs]), Modules: modules.All()},
			`sluice: job kind "demo.sleep" is registered twice (Config.Workers and module demo)`,
		},
		{
			"application alias and module",
			app.Program{Workers: bundleOf(withWorker[userAliasArgs]), Modules: []module.Module{demo.Module()}},
			`sluice: job kind "demo.sleep" is registered twice (Config.Workers and module demo)`,
		},
		{
			"application and core",
			app.Program{Workers: bundleOf(withWorker[userResumeArgs])},
			`sluice: job kind "concurrency_limit.resume" is registered twice (Config.Workers and sluice's core)`,
		},
		{
			"module and core",
			app.Program{Modules: []module.Module{coreClash}},
			`sluice: job kind "concurrency_limit.resume" is registered twice (sluice's core and module clash)`,
		},
		{
			"two modules",
			app.Program{Modules: []module.Module{demo.Module(), otherSleep}},
			`sluice: job kind "demo.sleep" is registered twice (module demo and module other)`,
		},
		{
			"a module's own kind listed twice",
			app.Program{Modules: []module.Module{{Name: "twice", Kinds: []kinds.Kind{kinds.Of[userArgs](), kinds.Of[userArgs]()}}}},
			`sluice: job kind "user.greet" is registered twice (module twice and module twice)`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := tc.p.Registry()
			require.Nil(t, r)
			require.EqualError(t, err, tc.want)
		})
	}
}

func TestProgramRegistryModuleNames(t *testing.T) {
	t.Parallel()

	for _, name := range []string{"", "Demo", "1demo", "_demo", "de-mo", "de.mo", "demo ", strings.Repeat("a", 41)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := app.Program{Modules: []module.Module{{Name: name}}}.Registry()
			require.EqualError(t, err, `sluice: invalid module name "`+name+`": want lowercase letters, digits and underscores`)
		})
	}
	for _, name := range []string{"a", "demo", "ci_builds2", strings.Repeat("a", 40)} {
		_, err := app.Program{Modules: []module.Module{{Name: name}}}.Registry()
		require.NoError(t, err, name)
	}

	t.Run("same module twice", func(t *testing.T) {
		t.Parallel()
		_, err := app.Program{Modules: append(modules.All(), demo.Module())}.Registry()
		require.EqualError(t, err, `sluice: module "demo" is turned on twice`)

		// The name is what counts, even with nothing in common.
		_, err = app.Program{Modules: []module.Module{{Name: "x", Kinds: []kinds.Kind{kinds.Of[userArgs]()}}, {Name: "x"}}}.Registry()
		require.EqualError(t, err, `sluice: module "x" is turned on twice`)
	})
}

func TestNewJobs(t *testing.T) {
	t.Parallel()

	pool := testdb.NewPool(t)
	newJobs := func(p app.Program) (*app.Jobs, error) {
		return app.NewJobs(pool, app.JobsConfig{
			Program: p, Logger: jobtest.Logger(t), Registerer: prometheus.NewRegistry(), WorkerID: "test-new-jobs",
		})
	}
	workedKinds := func(j *app.Jobs) []string {
		ks, err := kinds.FromWorkers(j.Workers)
		require.NoError(t, err)
		var names []string
		for _, k := range ks {
			names = append(names, k.Name)
		}
		return names
	}

	t.Run("works exactly the registry's kinds", func(t *testing.T) {
		user := bundleOf(withWorker[userArgs])
		j, err := newJobs(app.Program{Workers: user, Modules: modules.All()})
		require.NoError(t, err)
		require.Equal(t, j.Registry.Names(), workedKinds(j))
		require.Contains(t, workedKinds(j), "user.greet")
		require.Contains(t, workedKinds(j), "demo.sleep")

		own, err := kinds.FromWorkers(user)
		require.NoError(t, err)
		require.Equal(t, []kinds.Kind{kinds.Of[userArgs]()}, own, "the application's bundle is not changed")
	})

	t.Run("nothing to work", func(t *testing.T) {
		_, err := newJobs(app.Program{})
		require.ErrorIs(t, err, app.ErrNothingToWork)
	})

	t.Run("duplicate kind", func(t *testing.T) {
		_, err := newJobs(app.Program{Workers: bundleOf(withWorker[userSleepArgs]), Modules: modules.All()})
		require.EqualError(t, err, `sluice: job kind "demo.sleep" is registered twice (Config.Workers and module demo)`)
	})

	t.Run("module adds a worker for a kind it did not declare", func(t *testing.T) {
		rogue := module.Module{
			Name:  "rogue",
			Kinds: []kinds.Kind{kinds.Of[userArgs]()},
			AddWorkers: func(workers *river.Workers, _ *module.Env) error {
				if err := river.AddWorkerSafely(workers, noop[userArgs]()); err != nil {
					return err
				}
				return river.AddWorkerSafely(workers, noop[undeclaredArgs]())
			},
		}
		_, err := newJobs(app.Program{Modules: []module.Module{demo.Module(), rogue}})
		require.EqualError(t, err, `sluice: a module added a worker for kind "rogue.undeclared" without declaring it in its Kinds`)
	})

	t.Run("module declares a kind it adds no worker for", func(t *testing.T) {
		lazy := module.Module{Name: "lazy", Kinds: []kinds.Kind{kinds.Of[userArgs]()}}
		_, err := newJobs(app.Program{Modules: []module.Module{lazy}})
		require.EqualError(t, err, `sluice: kind "user.greet" is declared but no worker works it`)

		lazy.AddWorkers = func(*river.Workers, *module.Env) error { return nil }
		_, err = newJobs(app.Program{Modules: []module.Module{lazy}})
		require.EqualError(t, err, `sluice: kind "user.greet" is declared but no worker works it`)
	})

	t.Run("module adds a worker for an application kind", func(t *testing.T) {
		// Declaring nothing, the module passes the registry; River refuses
		// the second worker of the kind.
		thief := module.Module{
			Name: "thief",
			AddWorkers: func(workers *river.Workers, _ *module.Env) error {
				return river.AddWorkerSafely(workers, noop[userArgs]())
			},
		}
		user := bundleOf(withWorker[userArgs])
		_, err := newJobs(app.Program{Workers: user, Modules: []module.Module{thief}})
		require.EqualError(t, err, `sluice: module thief: add workers: worker for kind "user.greet" is already registered`)
	})

	t.Run("module's AddWorkers fails", func(t *testing.T) {
		boom := errors.New("boom")
		failing := module.Module{
			Name:       "failing",
			Kinds:      []kinds.Kind{kinds.Of[userArgs]()},
			AddWorkers: func(*river.Workers, *module.Env) error { return boom },
		}
		_, err := newJobs(app.Program{Modules: []module.Module{failing}})
		require.ErrorIs(t, err, boom)
		require.EqualError(t, err, "sluice: module failing: add workers: boom")
	})
}
