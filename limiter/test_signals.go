package limiter

import (
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"
)

// TestSignals let tests wait for the limiter's background work instead of
// sleeping (River's testsignal: no-ops unless a test calls Init).
type TestSignals struct {
	// Renewed: the worker renewed its lease of a kind and reconciled its
	// count of the kind's slots with the database's (value: the kind).
	Renewed testsignal.TestSignal[string]
	// RateWake: a rate window's timer fired and a resume of the kind is on
	// its way (value: the kind).
	RateWake testsignal.TestSignal[string]
	// HandedOver: a job that ended handed its slot to a job waiting in
	// the same worker, in memory (value: the job handed the slot).
	HandedOver testsignal.TestSignal[int64]
	// GrantListening: the line poller's grant listener LISTENs (again).
	GrantListening testsignal.TestSignal[struct{}]
	// GrantHeard: the line poller claimed a grant at a notification
	// (value: the job that got it).
	GrantHeard testsignal.TestSignal[int64]
	// LimitsListening: the limits listener LISTENs (again).
	LimitsListening testsignal.TestSignal[struct{}]
	// LimitsChanged: the limits listener heard of a change of a kind's
	// limits and expired the worker's copy (value: the kind).
	LimitsChanged testsignal.TestSignal[string]
}

// Init initializes every signal for tb.
func (ts *TestSignals) Init(tb testutil.TestingTB) {
	ts.Renewed.Init(tb)
	ts.RateWake.Init(tb)
	ts.HandedOver.Init(tb)
	ts.GrantListening.Init(tb)
	ts.GrantHeard.Init(tb)
	ts.LimitsListening.Init(tb)
	ts.LimitsChanged.Init(tb)
}
