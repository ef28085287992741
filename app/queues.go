package app

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/riverqueue/river"

	"github.com/sluice-dev/sluice/maintenance"
)

// MaxQueueWorkers is the most jobs a worker works at once from one queue.
const MaxQueueWorkers = 10000

// RunQueuePrefix starts the name of the private queue `sluice run` works its
// one job in; no worker serves it, and health does not count it as unserved.
const RunQueuePrefix = "sluice_run_"

// queueNameRE is River's rule for queue names (river.validateQueueName).
var queueNameRE = regexp.MustCompile(`^(?:[a-z0-9])+(?:[_|\-]?[a-z0-9]+)*$`)

// ValidateQueueName checks name against River's rule for queue names:
// lowercase letters and digits, separated by single _ or -, at most 64
// characters.
func ValidateQueueName(name string) error {
	if len(name) > 64 || !queueNameRE.MatchString(name) {
		return fmt.Errorf("invalid queue name %q: want lowercase letters and digits separated by _ or -, at most 64 characters", name)
	}
	return nil
}

// ParseQueues parses a list of queues with their concurrency, as
// `sluice worker --queues` takes it: "default=20,emails=5". Every queue
// name follows River's rule, appears once and is not maintenance (sized by
// --maintenance-workers); every count is between 1 and MaxQueueWorkers.
func ParseQueues(s string) (map[string]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("want QUEUE=N[,QUEUE=N...], such as default=20,emails=5")
	}
	queues := map[string]int{}
	for _, item := range strings.Split(s, ",") {
		name, count, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			return nil, fmt.Errorf("%q: want QUEUE=N, such as emails=5", item)
		}
		n, err := strconv.Atoi(count)
		if err != nil {
			return nil, fmt.Errorf("%q: %q is not a number of jobs", item, count)
		}
		if _, dup := queues[name]; dup {
			return nil, fmt.Errorf("queue %q is given twice", name)
		}
		queues[name] = n
	}
	if err := ValidateQueues(queues); err != nil {
		return nil, err
	}
	return queues, nil
}

// ValidateQueues checks the queues a worker serves besides maintenance:
// names by River's rule, not maintenance, counts between 1 and
// MaxQueueWorkers.
func ValidateQueues(queues map[string]int) error {
	for _, name := range slices.Sorted(maps.Keys(queues)) {
		if err := ValidateQueueName(name); err != nil {
			return err
		}
		if name == maintenance.Queue {
			return fmt.Errorf("queue %q is sluice's own and always served, with --maintenance-workers jobs at once", name)
		}
		if n := queues[name]; n < 1 || n > MaxQueueWorkers {
			return fmt.Errorf("queue %q: jobs at once must be between 1 and %d, got %d", name, MaxQueueWorkers, n)
		}
	}
	return nil
}

// FormatQueues writes queues as ParseQueues reads them, by name.
func FormatQueues(queues map[string]int) string {
	parts := make([]string, 0, len(queues))
	for _, name := range slices.Sorted(maps.Keys(queues)) {
		parts = append(parts, fmt.Sprintf("%s=%d", name, queues[name]))
	}
	return strings.Join(parts, ",")
}

// riverQueues is the River client's queue configuration of a worker that
// serves queues (each with its concurrency) and the maintenance queue.
func riverQueues(queues map[string]int, maintenanceWorkers int) map[string]river.QueueConfig {
	out := make(map[string]river.QueueConfig, len(queues)+1)
	for name, n := range queues {
		out[name] = river.QueueConfig{MaxWorkers: n}
	}
	out[maintenance.Queue] = river.QueueConfig{MaxWorkers: maintenanceWorkers}
	return out
}

// servedQueues is what the worker records in its sluice_workers row: every
// queue it serves, maintenance included, with its concurrency.
func servedQueues(queues map[string]int, maintenanceWorkers int) map[string]int {
	out := maps.Clone(queues)
	out[maintenance.Queue] = maintenanceWorkers
	return out
}
