package app

import (
	"fmt"
	"maps"
	"reflect"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// ownedRiverFields are the fields of River's config that sluice sets and a
// program's Config.River may not change, with the sluice setting to use
// instead.
var ownedRiverFields = []struct {
	name, instead string
	get           func(c *river.Config) any
}{
	{"Workers", "register workers in sluice's Config.Workers", func(c *river.Config) any { return c.Workers }},
	{"Queues", "use sluice's Config.Queues or DefaultWorkers (--queues)", func(c *river.Config) any { return maps.Clone(c.Queues) }},
	{"ID", "use sluice's Config.ID (--id)", func(c *river.Config) any { return c.ID }},
	{"Schema", "use sluice's Config.RiverSchema (--river-schema)", func(c *river.Config) any { return c.Schema }},
	{"Logger", "use sluice's Config.Logger", func(c *river.Config) any { return c.Logger }},
	{"RescueStuckJobsAfter", "sluice's reaper rescues the jobs of dead workers: use Config.DeadAfter (--dead-after)", func(c *river.Config) any { return c.RescueStuckJobsAfter }},
	{"LeaderElectionDisabled", "sluice's leader-only services need River's leader election", func(c *river.Config) any { return c.LeaderElectionDisabled }},
	{"TestOnly", "sluice runs River as in production", func(c *river.Config) any { return c.TestOnly }},
}

// configureRiver calls the program's River function (nil: none) on cfg,
// the River config sluice built, refuses a change to a field sluice owns
// (naming the field and the sluice setting to use), then puts sluice's
// insert middleware ins and worker middleware mw outermost: before the
// program's Middleware, or before its JobInsertMiddleware and
// WorkerMiddleware when it uses River's older fields (River refuses both
// at once). A job that parks never reaches the program's worker
// middleware; one that runs passes through it once.
func configureRiver(cfg *river.Config, configure func(*river.Config), ins []rivertype.JobInsertMiddleware, mw []rivertype.WorkerMiddleware) error {
	if configure != nil {
		before := make([]any, len(ownedRiverFields))
		for i, f := range ownedRiverFields {
			before[i] = f.get(cfg)
		}
		configure(cfg)
		for i, f := range ownedRiverFields {
			if !sameValue(before[i], f.get(cfg)) {
				return fmt.Errorf("sluice: Config.River changed River's %s, which sluice sets: %s", f.name, f.instead)
			}
		}
	}
	if len(cfg.Middleware) > 0 {
		all := make([]rivertype.Middleware, 0, len(ins)+len(mw)+len(cfg.Middleware))
		for _, m := range ins {
			all = append(all, m)
		}
		for _, m := range mw {
			all = append(all, m)
		}
		cfg.Middleware = append(all, cfg.Middleware...)
		return nil
	}
	cfg.JobInsertMiddleware = append(append([]rivertype.JobInsertMiddleware{}, ins...), cfg.JobInsertMiddleware...)
	cfg.WorkerMiddleware = append(append([]rivertype.WorkerMiddleware{}, mw...), cfg.WorkerMiddleware...)
	return nil
}

// sameValue compares two values of an owned field: pointers by identity,
// the rest by content.
func sameValue(a, b any) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	if va.Kind() == reflect.Pointer && vb.Kind() == reflect.Pointer {
		return va.Pointer() == vb.Pointer()
	}
	return reflect.DeepEqual(a, b)
}
