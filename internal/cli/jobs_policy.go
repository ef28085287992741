package cli

import (
	"encoding/json"
	"fmt"
	"time"
)

// policyMeta is what the enqueue policy trigger records in a job's
// metadata (sluice_policy).
type policyMeta struct {
	Key            string     `json:"key"`
	FirstWaitingAt *time.Time `json:"first_waiting_at"`
	Replaces       int        `json:"replaces"`
	ReplacedAt     *time.Time `json:"replaced_at"`
	LastOutcome    string     `json:"last_outcome"`
}

// describePolicy says how the kind's enqueue policy treated the job ("" for
// a job inserted with no policy).
func describePolicy(metadata json.RawMessage) string {
	var m struct {
		Policy *policyMeta `json:"sluice_policy"`
	}
	if json.Unmarshal(metadata, &m) != nil || m.Policy == nil {
		return ""
	}
	key := m.Policy.Key
	if key == "" {
		key = "(the kind)"
	}
	if m.Policy.Replaces == 0 || m.Policy.ReplacedAt == nil {
		return fmt.Sprintf("key %s; its args are those it was inserted with (never replaced)", key)
	}
	return fmt.Sprintf("key %s; %s %d time(s) by later enqueues, last at %s: its args are the last enqueue's",
		key, m.Policy.LastOutcome, m.Policy.Replaces, m.Policy.ReplacedAt.UTC().Format(time.RFC3339Nano))
}
