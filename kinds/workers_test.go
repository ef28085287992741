package kinds_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/kinds"
)

// greetArgs is a plain user kind.
type greetArgs struct {
	Name string `json:"name"`
}

func (greetArgs) Kind() string { return "test.greet" }

type greetWorker struct {
	river.WorkerDefaults[greetArgs]
}

func (*greetWorker) Work(context.Context, *river.Job[greetArgs]) error { return nil }

// renamedArgs is a kind being renamed from "test.old_name": River registers
// its worker under both names.
type renamedArgs struct {
	N int `json:"n"`
}

func (renamedArgs) Kind() string          { return "test.new_name" }
func (renamedArgs) KindAliases() []string { return []string{"test.old_name"} }

// ptrArgs is a kind whose args type is a pointer.
type ptrArgs struct {
	X int `json:"x"`
}

func (*ptrArgs) Kind() string { return "test.ptr" }

// userBundle is a bundle as an application builds it.
func userBundle(t *testing.T) *river.Workers {
	t.Helper()
	workers := river.NewWorkers()
	river.AddWorker(workers, &greetWorker{})
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[renamedArgs]) error { return nil }))
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[*ptrArgs]) error { return nil }))
	return workers
}

func TestFromWorkers(t *testing.T) {
	t.Parallel()

	got, err := kinds.FromWorkers(userBundle(t))
	require.NoError(t, err)
	require.Equal(t, []kinds.Kind{
		{Name: "test.greet", ArgsType: reflect.TypeFor[greetArgs]()},
		{Name: "test.new_name", ArgsType: reflect.TypeFor[renamedArgs]()},
		{Name: "test.old_name", ArgsType: reflect.TypeFor[renamedArgs]()},
		{Name: "test.ptr", ArgsType: reflect.TypeFor[*ptrArgs]()},
	}, got, "sorted by name, the alias a kind of its own with the same args type")
	require.Equal(t, kinds.Of[greetArgs](), got[0])
	require.Equal(t, kinds.Of[*ptrArgs](), got[3])

	t.Run("nil bundle", func(t *testing.T) {
		t.Parallel()
		got, err := kinds.FromWorkers(nil)
		require.NoError(t, err)
		require.Empty(t, got)
	})

	t.Run("empty bundle", func(t *testing.T) {
		t.Parallel()
		got, err := kinds.FromWorkers(river.NewWorkers())
		require.NoError(t, err)
		require.Empty(t, got)
	})

	t.Run("registry decodes every kind read", func(t *testing.T) {
		t.Parallel()
		ks, err := kinds.FromWorkers(userBundle(t))
		require.NoError(t, err)
		r, err := kinds.New(ks...)
		require.NoError(t, err)

		args, err := r.Decode("test.old_name", []byte(`{"n": 3}`))
		require.NoError(t, err)
		require.Equal(t, renamedArgs{N: 3}, args, "an alias decodes into the renamed kind's args")

		args, err = r.Decode("test.ptr", []byte(`{"x": 7}`))
		require.NoError(t, err)
		require.Equal(t, &ptrArgs{X: 7}, args)

		_, err = r.Decode("test.greet", []byte(`{"nom": "x"}`))
		require.ErrorContains(t, err, `unknown field "nom"`)
	})
}

func TestCloneWorkers(t *testing.T) {
	t.Parallel()

	orig := userBundle(t)
	before, err := kinds.FromWorkers(orig)
	require.NoError(t, err)

	clone, err := kinds.CloneWorkers(orig)
	require.NoError(t, err)
	require.NotSame(t, orig, clone)
	cloned, err := kinds.FromWorkers(clone)
	require.NoError(t, err)
	require.Equal(t, before, cloned, "the clone holds every worker, aliases included")

	// Every kind of the clone is taken: River refuses a second worker.
	require.ErrorContains(t, river.AddWorkerSafely(clone, &greetWorker{}), `worker for kind "test.greet" is already registered`)
	require.ErrorContains(t,
		river.AddWorkerSafely(clone, river.WorkFunc(func(context.Context, *river.Job[renamedArgs]) error { return nil })),
		"already registered")

	// Adding to the clone leaves the original alone.
	require.NoError(t, river.AddWorkerSafely(clone, river.WorkFunc(func(context.Context, *river.Job[otherArgs]) error { return nil })))
	after, err := kinds.FromWorkers(orig)
	require.NoError(t, err)
	require.Equal(t, before, after, "the original bundle is unchanged")
	cloned, err = kinds.FromWorkers(clone)
	require.NoError(t, err)
	require.Len(t, cloned, len(before)+1)
	require.Contains(t, cloned, kinds.Of[otherArgs]())

	// And the original can still take the kind the clone got.
	require.NoError(t, river.AddWorkerSafely(orig, river.WorkFunc(func(context.Context, *river.Job[otherArgs]) error { return nil })))

	t.Run("nil bundle", func(t *testing.T) {
		t.Parallel()
		clone, err := kinds.CloneWorkers(nil)
		require.NoError(t, err)
		require.NotNil(t, clone, "an empty bundle to add to")
		got, err := kinds.FromWorkers(clone)
		require.NoError(t, err)
		require.Empty(t, got)
		require.NoError(t, river.AddWorkerSafely(clone, &greetWorker{}))
	})
}

type otherArgs struct{}

func (otherArgs) Kind() string { return "test.other" }
