package limiter

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/sluice-dev/sluice/db"
)

// Park and wait reasons: what holds a job in the line. The first four hold
// up the whole kind (new jobs of the kind queue behind them); the key
// reasons hold up only the job's key.
const (
	reasonLimit    = "limit"     // the per-kind limit is reached
	reasonFIFO     = "fifo"      // older jobs of the kind wait
	reasonBreaker  = "breaker"   // the per-kind limit is a circuit breaker
	reasonRate     = "rate"      // the kind's rate window is full
	reasonKeyLimit = "key_limit" // the key's limit is reached
	reasonKeyFIFO  = "key_fifo"  // older jobs of the key wait
	reasonKeyRate  = "key_rate"  // the key's rate window is full
)

// keyReason reports whether a job held for reason waits for its key only.
func keyReason(reason string) bool {
	return reason == reasonKeyLimit || reason == reasonKeyFIFO || reason == reasonKeyRate
}

// rateReason reports whether a job held for reason waits for a rate window.
func rateReason(reason string) bool { return reason == reasonRate || reason == reasonKeyRate }

// setPartitionKeys sets the partition key of each request (fields nil: the
// kind has no partition, every key ""): from the job's args as River
// fetched them (jsonb's text, so the JSON text of a value is a slice of
// it), or, for a job without them, from its River row.
func setPartitionKeys(ctx context.Context, q *db.Queries, kind string, fields []string, reqs []*admitRequest) error {
	var fromDB []int64
	for _, r := range reqs {
		r.key = ""
		if fields == nil {
			continue
		}
		key, ok := partitionKey(r.job.EncodedArgs, fields)
		if !ok {
			fromDB = append(fromDB, r.job.ID)
			continue
		}
		r.key = key
	}
	if len(fromDB) == 0 {
		return nil
	}
	rows, err := q.JobPartitionKeys(ctx, db.JobPartitionKeysParams{Fields: fields, JobIds: fromDB})
	if err != nil {
		return fmt.Errorf("partition keys of %s jobs: %w", kind, err)
	}
	byID := make(map[int64]string, len(rows))
	for _, row := range rows {
		byID[row.JobID] = row.Key
	}
	for _, r := range reqs {
		if k, ok := byID[r.job.ID]; ok {
			r.key = k
		}
	}
	return nil
}

// partitionKey is sluice_partition_key of args (jsonb text): the JSON text
// of the field's value (null when missing), or the array of the values
// for several fields, as jsonb writes it. ok is false when args is not a
// JSON object.
func partitionKey(args []byte, fields []string) (string, bool) {
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
