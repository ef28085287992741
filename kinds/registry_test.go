package kinds_test

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/modules/demo"
)

func TestRegistryDecode(t *testing.T) {
	t.Parallel()

	registry := jobtest.Registry(t)

	args, err := registry.Decode("demo.sleep", []byte(`{"ms": 10, "ignore_cancel": true}`))
	require.NoError(t, err)
	require.Equal(t, demo.SleepArgs{MS: 10, IgnoreCancel: true}, args)

	args, err = registry.Decode("demo.sleep", nil)
	require.NoError(t, err, "no args means {}")
	require.Equal(t, demo.SleepArgs{}, args)

	for _, tc := range []struct {
		name, kind, raw, want string
	}{
		{"unknown kind", "demo.slep", `{}`, `unknown job kind "demo.slep"`},
		{"not an object", "demo.sleep", `[1]`, "must be a JSON object"},
		{"truncated", "demo.sleep", `{"ms": 1`, "malformed JSON"},
		{"syntax", "demo.sleep", `{"ms": 1,}`, "malformed JSON"},
		{"trailing data", "demo.sleep", `{"ms": 1} {}`, "after the args object"},
		{"unknown field", "demo.sleep", `{"sleep": 1}`, `unknown field "sleep"`},
		{"wrong type", "demo.sleep", `{"ms": "10"}`, `field "ms"`},
		{"fraction", "demo.sleep", `{"ms": 1.5}`, `field "ms"`},
		{"negative", "demo.sleep", `{"ms": -1}`, `field "ms": must be between 0`},
		{"too large", "demo.sleep", `{"ms": 86400001}`, `field "ms": must be between 0`},
		{"overflow", "demo.sleep", `{"ms": 99999999999999999999}`, `field "ms"`},
		{"case-insensitive name", "demo.sleep", `{"MS": 5}`, `unknown field "MS" (field names are case-sensitive: "ms")`},
		{"null for a number", "demo.sleep", `{"ms": null}`, `field "ms": null is not a int64`},
		{"null for a bool", "demo.sleep", `{"ms": 1, "fail": null}`, `field "fail": null is not a bool`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := registry.Decode(tc.kind, []byte(tc.raw))
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
			var unknown *kinds.UnknownKindError
			var argsErr *kinds.ArgsError
			require.True(t, errors.As(err, &unknown) || errors.As(err, &argsErr), "typed error: %T", err)
		})
	}
}

func TestNewDuplicateKind(t *testing.T) {
	t.Parallel()

	r, err := kinds.New(kinds.Of[plainArgs](), kinds.Of[demo.SleepArgs](), kinds.Of[plainArgs]())
	require.Nil(t, r)
	var dup *kinds.DuplicateKindError
	require.ErrorAs(t, err, &dup)
	require.Equal(t, "test.plain", dup.Kind)
	require.EqualError(t, err, `job kind "test.plain" is registered twice`)

	// Two args types that claim the same kind are a duplicate too.
	_, err = kinds.New(kinds.Of[demo.SleepArgs](), kinds.Of[fakeSleepArgs]())
	require.ErrorAs(t, err, &dup)
	require.Equal(t, "demo.sleep", dup.Kind)

	_, err = kinds.New(kinds.Kind{Name: "test.nameless"})
	require.ErrorContains(t, err, "needs a name and an args type")
	_, err = kinds.New(kinds.Kind{ArgsType: reflect.TypeFor[plainArgs]()})
	require.ErrorContains(t, err, "needs a name and an args type")

	r, err = kinds.New()
	require.NoError(t, err)
	require.Empty(t, r.Names())
}

func TestRegistryLookup(t *testing.T) {
	t.Parallel()

	r, err := kinds.New(kinds.Of[valueValidArgs](), kinds.Of[plainArgs]())
	require.NoError(t, err)
	require.Equal(t, []string{"test.plain", "test.value_valid"}, r.Names())
	require.Equal(t, []kinds.Kind{kinds.Of[plainArgs](), kinds.Of[valueValidArgs]()}, r.Kinds())
	require.True(t, r.Has("test.plain"))
	require.False(t, r.Has("test.plan"))

	k, err := r.Lookup("test.plain")
	require.NoError(t, err)
	require.Equal(t, reflect.TypeFor[plainArgs](), k.ArgsType)

	_, err = r.Lookup("test.plan")
	var unknown *kinds.UnknownKindError
	require.ErrorAs(t, err, &unknown)
	require.Equal(t, "test.plan", unknown.Kind)
	require.Equal(t, []string{"test.plain", "test.value_valid"}, unknown.Known)
	require.EqualError(t, err, `unknown job kind "test.plan" (known kinds: test.plain, test.value_valid)`)
}

// plainArgs has no Validate.
type plainArgs struct {
	Name  string `json:"name"`
	Count int    `json:"count"`
}

func (plainArgs) Kind() string { return "test.plain" }

// fakeSleepArgs claims demo.sleep's kind.
type fakeSleepArgs struct{}

func (fakeSleepArgs) Kind() string { return "demo.sleep" }

// valueValidArgs validates with a value receiver.
type valueValidArgs struct {
	Count int `json:"count"`
}

func (valueValidArgs) Kind() string { return "test.value_valid" }

func (a valueValidArgs) Validate() error {
	if a.Count <= 0 {
		return fmt.Errorf(`field "count": must be positive, got %d`, a.Count)
	}
	return nil
}

// ptrValidArgs validates with a pointer receiver.
type ptrValidArgs struct {
	Email string `json:"email"`
}

func (ptrValidArgs) Kind() string { return "test.ptr_valid" }

func (a *ptrValidArgs) Validate() error {
	if !strings.Contains(a.Email, "@") {
		return fmt.Errorf(`field "email": not an address: %q`, a.Email)
	}
	return nil
}

// refArgs names another kind, checked with a pointer-receiver ValidateIn
// after its Validate.
type refArgs struct {
	Target string `json:"target"`
}

func (refArgs) Kind() string { return "test.ref" }

func (a refArgs) Validate() error {
	if a.Target == "" {
		return errors.New(`field "target": required`)
	}
	return nil
}

func (a *refArgs) ValidateIn(r *kinds.Registry) error {
	if !r.Has(a.Target) {
		return fmt.Errorf(`field "target": no kind %q`, a.Target)
	}
	return nil
}

func userRegistry(t *testing.T) *kinds.Registry {
	t.Helper()
	r, err := kinds.New(
		kinds.Of[plainArgs](), kinds.Of[valueValidArgs](), kinds.Of[ptrValidArgs](), kinds.Of[refArgs](),
		kinds.Of[limiter.ResumeArgs](), kinds.Of[demo.SleepArgs](),
	)
	require.NoError(t, err)
	return r
}

func TestRegistryDecodeUserArgs(t *testing.T) {
	t.Parallel()

	r := userRegistry(t)

	for _, tc := range []struct {
		name, kind, raw string
		want            any
	}{
		{"without Validate", "test.plain", `{"name": "x", "count": -4}`, plainArgs{Name: "x", Count: -4}},
		{"without Validate, empty", "test.plain", ``, plainArgs{}},
		{"value Validate", "test.value_valid", `{"count": 2}`, valueValidArgs{Count: 2}},
		{"pointer Validate", "test.ptr_valid", `{"email": "a@b.c"}`, ptrValidArgs{Email: "a@b.c"}},
		{"ValidateIn", "test.ref", `{"target": "test.plain"}`, refArgs{Target: "test.plain"}},
		{"resume every kind", "concurrency_limit.resume", `{}`, limiter.ResumeArgs{}},
		{"resume a known kind", "concurrency_limit.resume", `{"kind": "demo.sleep"}`, limiter.ResumeArgs{JobKind: "demo.sleep"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args, err := r.Decode(tc.kind, []byte(tc.raw))
			require.NoError(t, err)
			require.Equal(t, tc.want, args)
			require.Equal(t, tc.kind, args.Kind())
		})
	}

	for _, tc := range []struct {
		name, kind, raw, want string
	}{
		{"rejects without Validate, unknown field", "test.plain", `{"nmae": "x"}`, `unknown field "nmae"`},
		{"rejects without Validate, wrong type", "test.plain", `{"count": "2"}`, `field "count": want int, got JSON string`},
		{"rejects value Validate", "test.value_valid", `{"count": 0}`, `field "count": must be positive, got 0`},
		{"rejects value Validate, empty", "test.value_valid", ``, `field "count": must be positive`},
		{"rejects pointer Validate", "test.ptr_valid", `{"email": "nobody"}`, `field "email": not an address: "nobody"`},
		{"rejects pointer Validate, empty", "test.ptr_valid", `{}`, `field "email": not an address`},
		{"rejects ValidateIn", "test.ref", `{"target": "test.nope"}`, `field "target": no kind "test.nope"`},
		{"rejects by Validate before ValidateIn", "test.ref", `{}`, `field "target": required`},
		{"rejects resume itself", "concurrency_limit.resume", `{"kind": "concurrency_limit.resume"}`, `field "kind": concurrency_limit.resume is never limited`},
		{"rejects resume an unknown kind", "concurrency_limit.resume", `{"kind": "demo.slep"}`, `field "kind": unknown job kind "demo.slep"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args, err := r.Decode(tc.kind, []byte(tc.raw))
			require.Nil(t, args)
			var argsErr *kinds.ArgsError
			require.ErrorAs(t, err, &argsErr)
			require.Equal(t, tc.kind, argsErr.Kind)
			require.ErrorContains(t, err, tc.want)
			require.True(t, strings.HasPrefix(err.Error(), "invalid args for "+tc.kind+": "), err.Error())
		})
	}
}

func TestRegistryValidateIn(t *testing.T) {
	t.Parallel()

	// The same args are valid or not depending on the registry.
	with := userRegistry(t)
	without, err := kinds.New(kinds.Of[limiter.ResumeArgs]())
	require.NoError(t, err)

	raw := []byte(`{"kind": "demo.sleep"}`)
	_, err = with.Decode(limiter.ResumeKind, raw)
	require.NoError(t, err)

	_, err = without.Decode(limiter.ResumeKind, raw)
	var argsErr *kinds.ArgsError
	require.ErrorAs(t, err, &argsErr)
	require.Equal(t, limiter.ResumeKind, argsErr.Kind)
	var unknown *kinds.UnknownKindError
	require.ErrorAs(t, err, &unknown, "ValidateIn's lookup error is wrapped, not flattened")
	require.Equal(t, "demo.sleep", unknown.Kind)
	require.Equal(t, []string{limiter.ResumeKind}, unknown.Known)

	// Called directly, ValidateIn reports the same.
	require.NoError(t, limiter.ResumeArgs{JobKind: "demo.sleep"}.ValidateIn(with))
	require.NoError(t, limiter.ResumeArgs{}.ValidateIn(without), "no kind: every kind")
	require.ErrorContains(t, limiter.ResumeArgs{JobKind: "demo.sleep"}.ValidateIn(without), `field "kind": unknown job kind "demo.sleep"`)
}

// nestedArgs have a nested object and fields that may be null.
type nestedArgs struct {
	Target struct {
		Host string `json:"host"`
		Port int    `json:"port"`
	} `json:"target"`
	Note  *string           `json:"note"`
	Extra map[string]string `json:"extra"`
	Tags  []string          `json:"tags"`
	Skip  string            `json:"-"`
	Plain int
}

func (nestedArgs) Kind() string { return "test.nested" }

// TestDecodeExactNested: exact names and no null apply inside nested
// objects too; null is fine where the field can hold it; a field without a
// tag is named as Go names it, exactly.
func TestDecodeExactNested(t *testing.T) {
	t.Parallel()
	registry, err := kinds.New(kinds.Of[nestedArgs]())
	require.NoError(t, err)

	_, err = registry.Decode("test.nested", []byte(`{"target": {"host": "h", "port": 1}, "note": null, "extra": null, "tags": null, "Plain": 3}`))
	require.NoError(t, err)
	for raw, want := range map[string]string{
		`{"target": {"Host": "h"}}`:  `unknown field "target.Host" (field names are case-sensitive: "target.host")`,
		`{"target": {"port": null}}`: `field "target.port": null is not a int`,
		`{"target": null}`:           `field "target": null is not a struct`,
		`{"plain": 3}`:               `unknown field "plain" (field names are case-sensitive: "Plain")`,
		`{"Skip": "x"}`:              `unknown field "Skip"`,
	} {
		_, err := registry.Decode("test.nested", []byte(raw))
		require.ErrorContains(t, err, want, raw)
		var argsErr *kinds.ArgsError
		require.ErrorAs(t, err, &argsErr)
	}
}
