package policy_test

import (
	"os"
	"testing"
)

// TestMain runs the test binary as a load worker when loadWorkerEnv is set
// (TestPropertyUnderLoad starts two).
func TestMain(m *testing.M) {
	if id := os.Getenv(loadWorkerEnv); id != "" {
		os.Exit(loadWorkerMain(id))
	}
	os.Exit(m.Run())
}
