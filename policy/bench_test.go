package policy_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/pgkit"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/policy"
)

// The P13 load.
const (
	benchInserters   = 8
	benchSingles     = 4_000 // single inserts per round, over the inserters
	benchSingleKeys  = 1_000
	benchMany        = 10_000
	benchRounds      = 3
	benchTargetRatio = 0.80
)

// benchArgs are the args of the benchmark's kinds: bench.plain has no
// policy, bench.discard and bench.replace have one by tenant, max 1, and
// so has bench.room (discard), whose keys always have room;
// bench.unique has no policy and is inserted as River's unique jobs by
// tenant (River's own duplicate answer, for reference).
type benchArgs struct {
	K      string `json:"k"`
	Tenant int    `json:"tenant" river:"unique"`
	N      int    `json:"n"`
}

func (a benchArgs) Kind() string { return "bench." + a.K }

// BenchmarkEnqueuePolicy (P13): inserts of a kind under a discard or a
// replace policy whose keys are all full (every insert meets the policy's
// conflict answer) against the same inserts of a kind with no policy, in
// alternating rounds on one database (medians of 3): single Insert calls
// from 8 goroutines (4,000 per round over 1,000 keys), and InsertMany of
// 10,000 (10,000 keys). Ratio = policy / plain; target ≥ 0.80. The main
// row is single inserts under discard; the #… rows the rest.
func BenchmarkEnqueuePolicy(b *testing.B) {
	ctx := context.Background()
	url := testdb.New(b)
	pool, err := pgkit.Open(ctx, withConns(url, benchInserters+2), 10*time.Second)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	require.NoError(b, err)
	store := policy.NewStore(pool)
	require.NoError(b, store.Set(ctx, policy.Policy{Kind: "bench.discard", ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Discard}))
	require.NoError(b, store.Set(ctx, policy.Policy{Kind: "bench.replace", ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Replace}))
	require.NoError(b, store.Set(ctx, policy.Policy{Kind: "bench.room", ByArgs: []string{"tenant"}, MaxWaiting: 1, OnConflict: policy.Discard}))
	// Fill every key of the policy kinds.
	for _, k := range []string{"discard", "replace", "unique"} {
		_, err := client.InsertMany(ctx, manyParams(k, benchMany, 0))
		require.NoError(b, err)
	}

	for range b.N {
		singles := map[string][]float64{}
		many := map[string][]float64{}
		for round := range benchRounds {
			for _, k := range []string{"plain", "discard", "replace", "unique", "room"} {
				singles[k] = append(singles[k], singleInserts(b, ctx, pool, client, k, round))
				many[k] = append(many[k], insertMany(b, ctx, pool, client, k, round))
			}
		}
		med := func(xs []float64) float64 { return jobtest.Median(xs) }
		b.ReportMetric(med(singles["discard"]), "discard-inserts/s")
		b.ReportMetric(med(singles["plain"]), "plain-inserts/s")
		b.ReportMetric(med(singles["discard"])/med(singles["plain"]), "ratio")
		b.ReportMetric(benchTargetRatio, "target")
		b.ReportMetric(med(singles["replace"]), "replace-inserts/s")
		b.ReportMetric(med(many["discard"]), "discard-many-rows/s")
		b.ReportMetric(med(many["replace"]), "replace-many-rows/s")
		b.ReportMetric(med(many["plain"]), "plain-many-rows/s")
		b.ReportMetric(med(many["discard"])/med(many["plain"]), "many-discard/plain")
		b.ReportMetric(med(many["replace"])/med(many["plain"]), "many-replace/plain")
		b.ReportMetric(med(singles["replace"])/med(singles["plain"]), "replace/plain")
		b.ReportMetric(med(singles["unique"]), "river-unique-inserts/s")
		b.ReportMetric(med(many["unique"]), "river-unique-many-rows/s")
		b.ReportMetric(med(singles["room"])/med(singles["plain"]), "room/plain")
		b.ReportMetric(med(many["room"])/med(many["plain"]), "many-room/plain")
		b.Logf("P13 single inserts from %d goroutines (inserts/s, rounds): plain %v, discard %v, replace %v, River unique duplicates %v",
			benchInserters, rounded(singles["plain"]), rounded(singles["discard"]), rounded(singles["replace"]), rounded(singles["unique"]))
		b.Logf("P13 InsertMany of %d (rows/s, rounds): plain %v, discard %v, replace %v, River unique duplicates %v",
			benchMany, rounded(many["plain"]), rounded(many["discard"]), rounded(many["replace"]), rounded(many["unique"]))
		b.Logf("P13 under a policy, every key with room (every insert goes in): single %v inserts/s, InsertMany %v rows/s",
			rounded(singles["room"]), rounded(many["room"]))
	}
}

// singleInserts inserts benchSingles jobs of kind k with Insert from
// benchInserters goroutines and returns inserts/s.
func singleInserts(b *testing.B, ctx context.Context, pool *pgxpool.Pool, client *river.Client[pgx.Tx], k string, round int) float64 {
	b.Helper()
	per := benchSingles / benchInserters
	var wg sync.WaitGroup
	errs := make(chan error, benchInserters)
	start := time.Now()
	for g := range benchInserters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				n := g*per + i
				if _, err := client.Insert(ctx, benchArgs{K: k, Tenant: n % benchSingleKeys, N: round*benchSingles + n}, optsOf(k)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	cleanInserted(b, ctx, pool, k)
	return float64(per*benchInserters) / elapsed.Seconds()
}

// insertMany inserts benchMany jobs of kind k (one per key) with one
// InsertMany and returns rows/s.
func insertMany(b *testing.B, ctx context.Context, pool *pgxpool.Pool, client *river.Client[pgx.Tx], k string, round int) float64 {
	b.Helper()
	params := manyParams(k, benchMany, (round+1)*benchMany)
	start := time.Now()
	res, err := client.InsertMany(ctx, params)
	elapsed := time.Since(start)
	require.NoError(b, err)
	require.Len(b, res, benchMany)
	if k != "plain" && k != "room" {
		require.True(b, res[0].UniqueSkippedAsDuplicate, "every key is full")
	}
	if k == "room" {
		require.False(b, res[0].UniqueSkippedAsDuplicate, "every key has room")
	}
	cleanInserted(b, ctx, pool, k)
	return float64(benchMany) / elapsed.Seconds()
}

// cleanInserted deletes the jobs of the plain kind (and of the kind whose
// keys have room), so that each round inserts into a table of the same
// size.
func cleanInserted(b *testing.B, ctx context.Context, pool *pgxpool.Pool, k string) {
	b.Helper()
	if k != "plain" && k != "room" {
		return
	}
	_, err := pool.Exec(ctx, "DELETE FROM river_job WHERE kind = 'bench.'||$1", k)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, "VACUUM ANALYZE river_job")
	require.NoError(b, err)
}

func manyParams(k string, n, base int) []river.InsertManyParams {
	out := make([]river.InsertManyParams, n)
	for i := range out {
		out[i] = river.InsertManyParams{Args: benchArgs{K: k, Tenant: i, N: base + i}, InsertOpts: optsOf(k)}
	}
	return out
}

// optsOf are the insert options of kind k: River's uniqueness by args
// (tenant) for bench.unique.
func optsOf(k string) *river.InsertOpts {
	if k == "unique" {
		return &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}
	}
	return nil
}

func rounded(xs []float64) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fmt.Sprintf("%.0f", x)
	}
	return out
}
