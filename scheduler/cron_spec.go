package scheduler

import (
	"math/bits"
	"time"
)

// allHours is the bit set of an hour field that matches every hour.
const allHours = 1<<24 - 1

// cronSpec is what a 5- or 6-field cron expression matches: a set of local
// (wall-clock) times, the same in every time zone. Cron maps them to
// instants in its zone.
type cronSpec struct {
	// second, minute and hour have bit v set when value v matches.
	second, minute, hour uint64
	// dom has bits 1 to 31 (day of the month), month bits 1 to 12.
	dom, month uint64
	// dow has bits 0 to 6, Sunday to Saturday.
	dow uint64
	// lastDom is L in the day-of-month field: the month's last day.
	lastDom bool
	// nthDow is N#k in the day-of-week field: bit k-1 of nthDow[N] is set
	// for the k-th weekday N of the month.
	nthDow [7]uint8
	// domStar and dowStar record a day field written * or ? (see
	// dayMatches).
	domStar, dowStar bool
}

// everyHour reports whether the hour field matches every hour. Such
// expressions follow real time across clock changes; the others follow
// the wall clock (see Cron).
func (s *cronSpec) everyHour() bool { return s.hour&allHours == allHours }

// dayMatches reports whether the date matches the day fields. As in Vixie
// cron and robfig/cron, when both day fields are restricted a day matching
// either runs; when either is * (or ?), the other decides.
func (s *cronSpec) dayMatches(y int, m time.Month, d int, wd time.Weekday) bool {
	domOK := s.dom&(1<<d) != 0 || (s.lastDom && d == daysIn(y, m))
	dowOK := s.dow&(1<<wd) != 0 || s.nthDow[wd]&(1<<((d-1)/7)) != 0
	if s.domStar || s.dowStar {
		return domOK && dowOK
	}
	return domOK || dowOK
}

// next returns the first local time at or after from that s matches and
// that is before limit; ok is false if there is none. Local times are held
// in time.Time values in UTC (a calendar without clock changes); from must
// be a whole second.
func (s *cronSpec) next(from, limit time.Time) (t time.Time, ok bool) {
	t = from
	for t.Before(limit) {
		y, mo, d := t.Date()
		if s.month&(1<<mo) == 0 {
			// The first day of the next month the expression names.
			if nm := nextBit(s.month, int(mo)+1); nm > 0 {
				t = time.Date(y, time.Month(nm), 1, 0, 0, 0, 0, time.UTC)
			} else {
				t = time.Date(y+1, time.Month(nextBit(s.month, 1)), 1, 0, 0, 0, 0, time.UTC)
			}
			continue
		}
		if !s.dayMatches(y, mo, d, t.Weekday()) {
			t = time.Date(y, mo, d+1, 0, 0, 0, 0, time.UTC)
			continue
		}
		h, mi, sec := t.Clock()
		nh := nextBit(s.hour, h)
		if nh < 0 {
			t = time.Date(y, mo, d+1, 0, 0, 0, 0, time.UTC)
			continue
		}
		if nh != h {
			h, mi, sec = nh, 0, 0
		}
		nm := nextBit(s.minute, mi)
		if nm < 0 {
			t = time.Date(y, mo, d, h+1, 0, 0, 0, time.UTC)
			continue
		}
		if nm != mi {
			mi, sec = nm, 0
		}
		ns := nextBit(s.second, sec)
		if ns < 0 {
			t = time.Date(y, mo, d, h, mi+1, 0, 0, time.UTC)
			continue
		}
		t = time.Date(y, mo, d, h, mi, ns, 0, time.UTC)
		return t, t.Before(limit)
	}
	return time.Time{}, false
}

// nextBit returns the lowest set bit of mask at or above from, or -1.
func nextBit(mask uint64, from int) int {
	if from > 63 {
		return -1
	}
	rest := mask >> from
	if rest == 0 {
		return -1
	}
	return from + bits.TrailingZeros64(rest)
}

// daysIn returns the number of days of month m of year y.
func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}
