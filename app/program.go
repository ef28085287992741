package app

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"

	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/kinds"
	"github.com/sluice-dev/sluice/limiter"
	"github.com/sluice-dev/sluice/migrations"
	"github.com/sluice-dev/sluice/module"
	"github.com/sluice-dev/sluice/policy"
	"github.com/sluice-dev/sluice/scheduler"
)

// Program is what a sluice program is made of besides its settings: the
// application's own River workers and migrations, and the modules it turns
// on. sluice's core (scheduler, limits and parking, liveness, maintenance
// framework, metrics and health) is always on.
type Program struct {
	// Workers are the application's River workers (nil: none).
	Workers *river.Workers
	// Migrations are the application's goose migrations (nil: none).
	Migrations fs.FS
	// Modules are the modules turned on.
	Modules []module.Module
	// Schemas are where sluice's objects (default schema sluice) and
	// River's tables (default: where the connection's search_path puts
	// them) live.
	Schemas pgkit.Schemas
	// Limits are the limits the program declares for its kinds, written by
	// every worker at start (a limit set by SQL or the CLI wins until
	// cleared).
	Limits []limiter.Limit
	// Schedules are the schedules the program declares, written by every
	// worker at start (an operator's change wins until `schedule reset`).
	Schedules []scheduler.Declared
	// Policies are the enqueue policies the program declares, written by
	// every worker at start (an operator's change wins until `policy
	// reset`).
	Policies []policy.Policy
	// River, if set, is called on the River config sluice built for a
	// worker (and for `run`, and for InsertClient) before the client is
	// created: whatever it sets is used (ErrorHandler, Middleware, Hooks,
	// RetryPolicy, MaxAttempts, retention, PeriodicJobs, …), but a change
	// to a field sluice owns is refused (configureRiver), and sluice's
	// middleware stays outermost.
	River func(*river.Config)
	// TracerProvider makes sluice's spans (nil: the global provider).
	TracerProvider trace.TracerProvider
}

// CheckLimits validates the declared limits against the program's kinds:
// known kinds, at most one Limit per kind, valid values.
func (p Program) CheckLimits(registry *kinds.Registry) error {
	seen := map[string]bool{}
	for _, lim := range p.Limits {
		if seen[lim.Kind] {
			return fmt.Errorf("sluice: Config.Limits: %w: kind %q is declared twice", limiter.ErrInvalidLimit, lim.Kind)
		}
		seen[lim.Kind] = true
		if err := lim.Validate(registry); err != nil {
			return fmt.Errorf("sluice: Config.Limits: %w", err)
		}
	}
	return nil
}

// CheckPolicies validates the declared enqueue policies against the
// program's kinds: known kinds, at most one policy per kind, valid values.
func (p Program) CheckPolicies(registry *kinds.Registry) error {
	seen := map[string]bool{}
	for _, pol := range p.Policies {
		if seen[pol.Kind] {
			return fmt.Errorf("sluice: Config.Policies: %w: kind %q is declared twice", policy.ErrInvalid, pol.Kind)
		}
		seen[pol.Kind] = true
		if err := pol.Validate(registry); err != nil {
			return fmt.Errorf("sluice: Config.Policies: %w", err)
		}
	}
	return nil
}

// CheckDeclarations validates the limits (CheckLimits), the enqueue
// policies (CheckPolicies) and the schedules the program declares,
// returning the schedules compiled for the schedules table
// (scheduler.CompileDeclared). The error names the kind or schedule.
func (p Program) CheckDeclarations(registry *kinds.Registry) ([]scheduler.DeclaredRow, error) {
	if err := p.CheckLimits(registry); err != nil {
		return nil, err
	}
	if err := p.CheckPolicies(registry); err != nil {
		return nil, err
	}
	return scheduler.CompileDeclared(registry, p.Schedules)
}

// MigrationOptions are the migrations of the program besides River's and
// sluice's core: the modules' and the application's.
func (p Program) MigrationOptions(logger *slog.Logger) migrations.Options {
	return migrations.Options{Modules: p.Modules, App: p.Migrations, Logger: logger}
}

// ErrNothingToWork is the error of a program without workers and modules.
var ErrNothingToWork = errors.New("sluice: nothing to work: the Config has no Workers and no Modules (register River workers with river.AddWorker, or turn on a module)")

var moduleNameRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,39}$`)

// reservedModuleNames name migration components of their own.
var reservedModuleNames = map[string]bool{migrations.ComponentApp: true, migrations.ComponentSluice: true, migrations.ComponentRiver: true}

// coreKinds are the kinds of sluice's core.
func coreKinds() []kinds.Kind {
	return []kinds.Kind{kinds.Of[limiter.ResumeArgs]()}
}

// Registry returns the registry of every kind the program works: the
// application's (from its Workers bundle), the core's and the modules'. A
// kind registered twice is an error naming it and where.
func (p Program) Registry() (*kinds.Registry, error) {
	own, err := kinds.FromWorkers(p.Workers)
	if err != nil {
		return nil, err
	}
	if len(own) == 0 && len(p.Modules) == 0 {
		return nil, ErrNothingToWork
	}
	where := map[string]string{}
	var all []kinds.Kind
	add := func(ks []kinds.Kind, origin string) error {
		for _, k := range ks {
			if prev, ok := where[k.Name]; ok {
				return fmt.Errorf("sluice: job kind %q is registered twice (%s and %s)", k.Name, prev, origin)
			}
			where[k.Name] = origin
			all = append(all, k)
		}
		return nil
	}
	if err := add(own, "Config.Workers"); err != nil {
		return nil, err
	}
	if err := add(coreKinds(), "sluice's core"); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, m := range p.Modules {
		if !moduleNameRE.MatchString(m.Name) || reservedModuleNames[m.Name] {
			return nil, fmt.Errorf("sluice: invalid module name %q: want lowercase letters, digits and underscores", m.Name)
		}
		if seen[m.Name] {
			return nil, fmt.Errorf("sluice: module %q is turned on twice", m.Name)
		}
		seen[m.Name] = true
		if err := add(m.Kinds, "module "+m.Name); err != nil {
			return nil, err
		}
	}
	return kinds.New(all...)
}
