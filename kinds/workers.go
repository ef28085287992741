package kinds

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"unsafe"

	"github.com/riverqueue/river"
)

// ErrWorkersUnreadable is returned by FromWorkers when the River version in
// use keeps its workers in a form sluice does not know.
var ErrWorkersUnreadable = errors.New("kinds: cannot read the kinds of a river.Workers bundle with this River version")

// FromWorkers lists the kinds registered in workers (with River's
// river.AddWorker), each with the args type its worker takes, sorted by
// name. A kind alias (river.JobArgsWithKindAliases) is listed as a kind of
// its own with the same args type.
//
// River keeps the bundle's contents unexported, so FromWorkers reads them by
// reflection: the kind names and the args types only, never a value.
func FromWorkers(workers *river.Workers) ([]Kind, error) {
	if workers == nil {
		return nil, nil
	}
	m := reflect.ValueOf(workers).Elem().FieldByName("workersMap")
	if !m.IsValid() || m.Kind() != reflect.Map || m.Type().Key().Kind() != reflect.String {
		return nil, ErrWorkersUnreadable
	}
	out := make([]Kind, 0, m.Len())
	iter := m.MapRange()
	for iter.Next() {
		info := iter.Value()
		if info.Kind() != reflect.Struct {
			return nil, ErrWorkersUnreadable
		}
		args := info.FieldByName("jobArgs")
		if !args.IsValid() || args.Kind() != reflect.Interface {
			return nil, ErrWorkersUnreadable
		}
		if args.IsNil() {
			return nil, fmt.Errorf("%w: kind %q has no args type", ErrWorkersUnreadable, iter.Key().String())
		}
		out = append(out, Kind{Name: iter.Key().String(), ArgsType: args.Elem().Type()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// CloneWorkers returns a new bundle holding every worker of workers (nil:
// an empty bundle), so that sluice can add its own workers without changing
// the application's bundle.
func CloneWorkers(workers *river.Workers) (*river.Workers, error) {
	out := river.NewWorkers()
	if workers == nil {
		return out, nil
	}
	src := reflect.ValueOf(workers).Elem().FieldByName("workersMap")
	dst := reflect.ValueOf(out).Elem().FieldByName("workersMap")
	if !src.IsValid() || !dst.IsValid() || src.Kind() != reflect.Map || src.Type() != dst.Type() {
		return nil, ErrWorkersUnreadable
	}
	// The map is unexported: reach it through its address.
	src = reflect.NewAt(src.Type(), unsafe.Pointer(src.UnsafeAddr())).Elem()
	dst = reflect.NewAt(dst.Type(), unsafe.Pointer(dst.UnsafeAddr())).Elem()
	iter := src.MapRange()
	for iter.Next() {
		dst.SetMapIndex(iter.Key(), iter.Value())
	}
	return out, nil
}
