package ledger

import (
	"encoding/json"
	"fmt"
	"time"
)

// The documents a transaction reads, once its locks are held: what a
// decision reads (LedgerDecideState) and what a grant round reads
// (LedgerGrantState).

// decideState is what a decision of jobs reads.
type decideState struct {
	Jobs  []jobHolding `json:"jobs"`
	Kinds []kindLine   `json:"kinds"`
	Keys  []keyLine    `json:"keys"`
}

// jobHolding is what the ledger holds for a job.
type jobHolding struct {
	JobID         int64  `json:"job_id"`
	Kind          string `json:"kind"`
	Key           string `json:"key"`
	SlotReserved  bool   `json:"slot_reserved"`
	StartReserved bool   `json:"start_reserved"`
	SlotHeld      bool   `json:"slot_held"`
	SlotStale     bool   `json:"slot_stale"`
	StartHeld     bool   `json:"start_held"`
	Waiter        bool   `json:"waiter"`
	Ahead         bool   `json:"ahead"`
}

// granted reports whether the job holds a grant of its line: a slot or a
// start, reserved for it or taken.
func (h jobHolding) granted() bool {
	return h.SlotHeld || h.SlotReserved || h.StartHeld || h.StartReserved
}

// kindLine is a kind's line as a decision reads it: its limits, the
// oldest job waiting for the kind itself (0: none), the newest slots of a
// kind without a partition reserved for jobs on their way (newest first,
// up to maxSteals), how many of it wait (up to the cap asked), and its
// rate window.
type kindLine struct {
	limitFields
	Front          int64   `json:"front"`
	ReservedSlots  []int64 `json:"reserved_slots"`
	ReservedStarts []int64 `json:"reserved_starts"`
	ReservedBoth   []int64 `json:"reserved_both"` // the newest jobs with both a slot and a start reserved
	// Transit is the oldest job granted a slot of the kind and not
	// fetched yet: without a partition, its line's; with one, of any key,
	// under a kind-wide limit (0: none).
	Transit   int64 `json:"transit"`
	Fetched   int64 `json:"fetched"`
	Waiting   int64 `json:"waiting"`
	Ahead     int   `json:"ahead"`
	Starts    int32 `json:"starts"`
	FreesInMs int64 `json:"frees_in_ms"`
}

// keyLine is a key's line as a decision reads it: its slots, the newest
// of them reserved for jobs on their way (newest first, up to maxSteals),
// its oldest waiting job, how many wait, and its rate window.
type keyLine struct {
	Kind           string  `json:"kind"`
	Key            string  `json:"key"`
	Slots          int32   `json:"slots"`
	ReservedSlots  []int64 `json:"reserved_slots"`
	ReservedStarts []int64 `json:"reserved_starts"`
	ReservedBoth   []int64 `json:"reserved_both"` // the newest jobs with both a slot and a start reserved
	Transit        int64   `json:"transit"`
	Fetched        int64   `json:"fetched"` // the oldest job fetched by a worker and not decided yet (0: none)
	Waiting        int64   `json:"waiting"` // the oldest job waiting in a worker without a grant (0: none)
	Front          int64   `json:"front"`
	Ahead          int     `json:"ahead"`
	Starts         int32   `json:"starts"`
	FreesInMs      int64   `json:"frees_in_ms"`
}

// grantState is what a grant round reads.
type grantState struct {
	Kinds []grantKind `json:"kinds"`
}

// limitFields are a kind's limit row in a document.
type limitFields struct {
	Kind         string   `json:"kind"`
	Max          int32    `json:"max"`
	Admitted     *int32   `json:"admitted"`
	HasParked    bool     `json:"has_parked"`
	Fields       []string `json:"fields"`
	KeyMax       *int32   `json:"key_max"`
	RateMax      *int32   `json:"rate_max"`
	RatePeriodMs int64    `json:"rate_period_ms"`
	RatePerKey   bool     `json:"rate_per_key"`
}

// grantKind is a kind as a grant round reads it.
type grantKind struct {
	limitFields
	Starts         int32   `json:"starts"`
	FreesInMs      *int64  `json:"frees_in_ms"`
	OldestReserved *int64  `json:"oldest_reserved"`
	KindWaiting    bool    `json:"kind_waiting"`
	Ahead          int     `json:"ahead"`
	Front          []front `json:"front"`
	// KeyDepth is how many jobs of each key's line the round read (its
	// front), at most.
	KeyDepth int        `json:"key_depth"`
	Keys     []grantKey `json:"keys"`
	// TurnMore: keys with waiting jobs wait past those read in the round's
	// order (the read stopped at its turn_keys).
	TurnMore bool `json:"turn_more"`
	// Short: TurnMore in a read narrower than maxTurnKeys (set by
	// grantState): a round that needs the keys past it reads them.
	Short bool `json:"-"`
}

// limits are the kind's limits and counts.
func (g limitFields) limits() Limits {
	out := Limits{Kind: g.Kind, Present: true, Max: g.Max, HasParked: g.HasParked, Fields: g.Fields, RatePerKey: g.RatePerKey}
	if g.Admitted != nil {
		out.Admitted = *g.Admitted
	}
	if g.KeyMax != nil {
		out.KeyMax = *g.KeyMax
	}
	if g.RateMax != nil && g.RatePeriodMs > 0 {
		out.RateMax, out.RatePeriod = *g.RateMax, time.Duration(g.RatePeriodMs)*time.Millisecond
	}
	return out
}

// grantKey is a key as a grant round reads it.
type grantKey struct {
	Key string `json:"key"`
	// Turn: read as one of the keys with waiting jobs in the round's order
	// (not only named by the caller).
	Turn           bool    `json:"turn"`
	Slots          int32   `json:"slots"`
	OldestReserved *int64  `json:"oldest_reserved"`
	Starts         int32   `json:"starts"`
	FreesInMs      *int64  `json:"frees_in_ms"`
	Front          []front `json:"front"`
	// Others is how many jobs of the key wait without being parked (in a
	// worker, resumed ahead, or fetched and not decided), in its front or
	// past it.
	Others int `json:"others"`
	// SinceUs is when the key began waiting for its next turn (its last
	// turn, or its arrival), ServedUs when it last had one (nil: never),
	// in microseconds since the epoch.
	SinceUs  *int64 `json:"since_us"`
	ServedUs *int64 `json:"served_us"`
}

// front is a job at the front of a line: parked, or waiting in a worker
// (WorkerID) or resumed ahead (no worker), without a grant.
type front struct {
	JobID     int64   `json:"job_id"`
	Parked    bool    `json:"parked"`
	WorkerID  *string `json:"worker_id"`
	Ready     bool    `json:"ready"`
	Resumable bool    `json:"resumable"`
	Queue     string  `json:"queue"`
	Reason    string  `json:"reason"`
	Ahead     bool    `json:"ahead"`
	// Completing: parked in its worker, its parking not written by River's
	// completer yet (not ready, not resumable); a grant may be reserved
	// for it, and its completion resumes it.
	Completing bool `json:"completing"`
}

// worker is the worker the job waits in ("": none).
func (f front) worker() string {
	if f.WorkerID == nil {
		return ""
	}
	return *f.WorkerID
}

// decode decodes a document read.
func decode[T any](raw []byte, what string) (*T, error) {
	var out T
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("decode %s: %w", what, err)
	}
	return &out, nil
}

// ms is a count of milliseconds as a duration.
func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
