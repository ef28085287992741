package scheduler

import (
	"github.com/riverqueue/river/rivershared/testsignal"
	"github.com/riverqueue/river/rivershared/util/testutil"
)

// TestSignals let tests wait for the dispatcher's background work instead
// of polling (River's testsignal: no-ops unless a test calls Init).
type TestSignals struct {
	// Listening: the dispatcher's LISTEN connection is established (again,
	// after a reconnect).
	Listening testsignal.TestSignal[struct{}]
	// Ticked: a tick ended well (value: its result).
	Ticked testsignal.TestSignal[TickResult]
}

// Init initializes every signal for tb.
func (ts *TestSignals) Init(tb testutil.TestingTB) {
	ts.Listening.Init(tb)
	ts.Ticked.Init(tb)
}
