package ledger

import (
	"encoding/json"
	"strings"
)

// Park and wait reasons: what holds a job in the line. The first four hold
// up the whole kind (new jobs of the kind queue behind them); the key
// reasons hold up only the job's key.
const (
	ReasonLimit    = "limit"     // the per-kind limit is reached
	ReasonFIFO     = "fifo"      // older jobs of the kind wait
	ReasonBreaker  = "breaker"   // the per-kind limit is a circuit breaker
	ReasonRate     = "rate"      // the kind's rate window is full
	ReasonKeyLimit = "key_limit" // the key's limit is reached
	ReasonKeyFIFO  = "key_fifo"  // older jobs of the key wait
	ReasonKeyRate  = "key_rate"  // the key's rate window is full
)

// KeyReason reports whether a job held for reason waits for its key only.
func KeyReason(reason string) bool {
	return reason == ReasonKeyLimit || reason == ReasonKeyFIFO || reason == ReasonKeyRate
}

// RateReason reports whether a job held for reason waits for a rate
// window.
func RateReason(reason string) bool { return reason == ReasonRate || reason == ReasonKeyRate }

// PartitionKey is sluice_partition_key of args (jsonb text): the JSON text
// of the field's value (null when missing), or the array of the values for
// several fields, as jsonb writes it ("" without fields). ok is false when
// args is not a JSON object. The ledger locks a key's row by it before it reads the key's
// partition under the lock, and checks it then.
func PartitionKey(args []byte, fields []string) (string, bool) {
	if len(fields) == 0 {
		return "", true // no partition: no key
	}
	if len(args) == 0 {
		return "", false
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(args, &obj); err != nil || obj == nil {
		return "", false
	}
	value := func(f string) string {
		if v, ok := obj[f]; ok {
			return string(v)
		}
		return "null"
	}
	if len(fields) == 1 {
		return value(fields[0]), true
	}
	parts := make([]string, len(fields))
	for i, f := range fields {
		parts[i] = value(f)
	}
	return "[" + strings.Join(parts, ", ") + "]", true
}
