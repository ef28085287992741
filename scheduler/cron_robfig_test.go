package scheduler_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/scheduler"
)

// TestCronParserAgreesWithRobfig: on the syntax robfig/cron/v3 accepts
// too (no 7, L or N#k; ? only in the day fields), the parser reads every
// field as robfig/cron does, including which day fields count as * for
// the rule that combines them. Schedules written for the robfig/cron
// parser sluice used before keep their meaning.
func TestCronParserAgreesWithRobfig(t *testing.T) {
	t.Parallel()

	robfig := cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	const starBit = 1 << 63
	r := rand.New(rand.NewPCG(18, 7))
	exprs := []string{"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly",
		"* * * * *", "*/1 * * * *", "0 0 ? * *", "0 0 * * ?", "0 0 */1 * 1", "0 0 */2 * 1", "0 0 1-31 * 1"}
	days := []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}
	months := []string{"", "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"}
	for range 500 {
		fields := []string{
			genList(r, 0, 59, []int{0, 30}, nil),
			genList(r, 0, 23, []int{0, 12}, nil),
			oneOf(r, "*", "?", genList(r, 1, 31, []int{1, 31}, nil)),
			oneOf(r, "*", genList(r, 1, 12, []int{1, 12}, months)),
			oneOf(r, "*", "?", genList(r, 0, 6, []int{0, 6}, days)),
		}
		if r.IntN(2) == 0 {
			fields = append([]string{genList(r, 0, 59, []int{0, 59}, nil)}, fields...)
		}
		exprs = append(exprs, strings.Join(fields, " "))
	}
	for _, e := range exprs {
		ours, err := scheduler.ParseCron(e, "UTC")
		if err != nil {
			require.ErrorContains(t, err, "never fires", e)
			continue
		}
		sched, err := robfig.Parse(e)
		require.NoError(t, err, e)
		spec := sched.(*cron.SpecSchedule)
		bits, domStar, dowStar, ok := scheduler.SpecSets(ours)
		require.True(t, ok)
		theirs := [6]uint64{spec.Second, spec.Minute, spec.Hour, spec.Dom, spec.Month, spec.Dow}
		for i := range theirs {
			theirs[i] &^= starBit
		}
		require.Equal(t, theirs, bits, e)
		require.Equal(t, spec.Dom&starBit != 0, domStar, "%s: day-of-month is *", e)
		require.Equal(t, spec.Dow&starBit != 0, dowStar, "%s: day-of-week is *", e)
	}
}

// oneOf returns one of its arguments at random.
func oneOf(r *rand.Rand, choices ...string) string { return choices[r.IntN(len(choices))] }
