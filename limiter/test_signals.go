package limiter

import (
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"
)

// TestSignals let tests wait for the limiter's background work instead of
// sleeping (River's testsignal: no-ops unless a test calls Init).
type TestSignals struct {
	// Listening: the listener LISTENs (again) on the limits' and the
	// grants' channels.
	Listening testsignal.TestSignal[struct{}]
	// LimitsChanged: the listener heard of a change of a kind's limits and
	// expired the worker's copy (value: the kind).
	LimitsChanged testsignal.TestSignal[string]
	// GrantHeard: a grant note woke a job waiting here (value: the job).
	GrantHeard testsignal.TestSignal[int64]
	// Rechecked: a job granted or decided to run, not begun, was decided
	// again because the worker heard a change of its kind's limits it could
	// not tell its grant or decision had seen (value: the job).
	Rechecked testsignal.TestSignal[int64]
	// HandedOver: a job that ended handed its slot to a job waiting in
	// the same worker, in memory (value: the job handed the slot).
	HandedOver testsignal.TestSignal[int64]
	// Swapped: a job of this worker put in the line took the slot of a
	// younger job of its key here that had not started, which waits in
	// its place (value: the older job).
	Swapped testsignal.TestSignal[int64]
	// Renewed: the keeper renewed the worker's lease of a kind and
	// reconciled its count of the kind's slots (value: the kind).
	Renewed testsignal.TestSignal[string]
	// RateWake: a rate window's timer fired and a grant round of the kind
	// is on its way (value: the kind).
	RateWake testsignal.TestSignal[string]
	// ReservationFreed: the listener heard that a job holding a
	// reservation went, and the kind's clean-up ran (value: the kind).
	ReservationFreed testsignal.TestSignal[string]
	// LookedAtFetch: a fetch read the state of a kind on the leased path
	// in its transaction, for its first attempts to take a spare leased
	// slot by (value: the kind).
	LookedAtFetch testsignal.TestSignal[string]
}

// Init initializes every signal for tb.
func (ts *TestSignals) Init(tb testutil.TestingTB) {
	ts.Listening.Init(tb)
	ts.LimitsChanged.Init(tb)
	ts.GrantHeard.Init(tb)
	ts.Rechecked.Init(tb)
	ts.HandedOver.Init(tb)
	ts.Swapped.Init(tb)
	ts.Renewed.Init(tb)
	ts.RateWake.Init(tb)
	ts.ReservationFreed.Init(tb)
	ts.LookedAtFetch.Init(tb)
}
