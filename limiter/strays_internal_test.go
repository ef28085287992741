package limiter

import (
	"testing"

	"github.com/riverqueue/river/rivertype"

	"github.com/sluice-dev/sluice/limiter/internal/ledger"
)

// TestStraysDecideTogetherInOrder: the first stray of a kind to reach the
// middleware takes itself and the older strays of its kind, in job-id
// order, and none of another kind or younger; an older one that arrives
// meanwhile waits for that batch's decision and learns whether it parked;
// one whose kind has no limit is a stray no more.
func TestStraysDecideTogetherInOrder(t *testing.T) {
	row := func(id int64, kind string) *rivertype.JobRow { return &rivertype.JobRow{ID: id, Kind: kind} }
	var s strays
	s.add([]*rivertype.JobRow{row(3, "a"), row(1, "a"), row(2, "b"), row(5, "a"), row(4, "a")})

	st, batch := s.claim(row(4, "a"), true)
	if st != nil || len(batch) != 3 || batch[0].ID != 1 || batch[1].ID != 3 || batch[2].ID != 4 {
		t.Fatalf("claim of job 4: stray %v, batch %v; want jobs 1, 3, 4", st, ids(batch))
	}
	older, none := s.claim(row(1, "a"), true)
	if older == nil || none != nil {
		t.Fatalf("claim of job 1, taken by job 4's batch: stray %v, batch %v", older, ids(none))
	}
	select {
	case <-older.decided:
		t.Fatal("job 1's decision is out before the batch's")
	default:
	}
	three := s.taken(3)
	if three == nil {
		t.Fatal("job 3, in job 4's batch, is not taken")
	}
	if s.taken(5) != nil {
		t.Fatal("job 5, in no batch, is taken")
	}
	s.done(batch, map[int64]ledger.Decision{1: {Job: 1, Action: ledger.Parked}}, nil)
	<-three.decided
	if three.gone != nil || three.err != nil {
		t.Fatalf("job 3 after the batch: decision %v, err %v; want none (in its queue)", three.gone, three.err)
	}
	<-older.decided
	if older.gone == nil || older.gone.Action != ledger.Parked || older.err != nil {
		t.Fatalf("job 1 after the batch: decision %v, err %v; want parked", older.gone, older.err)
	}
	if st, batch := s.claim(row(2, "b"), false); st != nil || batch != nil {
		t.Fatalf("claim of job 2, no limit: stray %v, batch %v", st, ids(batch))
	}
	if st, batch := s.claim(row(2, "b"), true); st != nil || batch != nil {
		t.Fatalf("job 2 is a stray still: stray %v, batch %v", st, ids(batch))
	}
	if st, batch := s.claim(row(5, "a"), true); st != nil || len(batch) != 1 || batch[0].ID != 5 {
		t.Fatalf("claim of job 5: stray %v, batch %v; want job 5 alone", st, ids(batch))
	}
}

func ids(jobs []*rivertype.JobRow) []int64 {
	out := make([]int64, len(jobs))
	for i, j := range jobs {
		out[i] = j.ID
	}
	return out
}
