package scheduler

import "time"

// zoneSegment is a stretch of time during which a zone's UTC offset stays
// the same: [start, end), start zero from the beginning of time, end zero
// for ever.
type zoneSegment struct {
	start, end time.Time
	// offset is the segment's offset and prevOffset the one before start,
	// in seconds east of UTC.
	offset, prevOffset int
}

// zoneSegmentAt returns the segment holding t (t in the zone). Segments
// may end where the offset does not change (Go splits the years past a
// zone's table of transitions at their start).
func zoneSegmentAt(t time.Time) zoneSegment {
	start, end := t.ZoneBounds()
	_, off := t.Zone()
	// Past the table, Go's ZoneBounds ends a leap year's last stretch 365
	// days after the start of the (UTC) year, a day early
	// (golang/go#81583): on the last day of such a year it returns an end
	// that is not after t. The stretch ends with the year.
	if !end.IsZero() && !end.After(t) {
		end = time.Date(t.UTC().Year()+1, time.January, 1, 0, 0, 0, 0, time.UTC).In(t.Location())
	}
	prev := off
	if !start.IsZero() {
		_, prev = start.Add(-time.Nanosecond).Zone()
	}
	return zoneSegment{start: start, end: end, offset: off, prevOffset: prev}
}

// nextIn returns the first due time of c after t that falls in seg, and
// before horizon. In the segment the local time is the instant plus the
// offset; the local times it covers that an earlier segment covered too
// (after the clocks went back) ran there already under wall-clock
// semantics, and the local times the clocks skipped at its start (after
// they went forward) run at its start, as far after it as they were after
// the jump.
func (c *Cron) nextIn(seg zoneSegment, t, horizon time.Time) (time.Time, bool) {
	off := seg.offset
	from := afterSecond(localTime(t, off))
	if !seg.start.IsZero() {
		low := localTime(seg.start, off)
		if c.wall && seg.prevOffset > off {
			// The clocks went back: the repeated local times ran at
			// their first occurrence, in the segment before.
			low = localTime(seg.start, seg.prevOffset)
		}
		if from.Before(low) {
			from = low
		}
	}
	end := horizon
	if !seg.end.IsZero() && seg.end.Before(horizon) {
		end = seg.end
	}
	var best time.Time
	found := false
	if w, ok := c.spec.next(from, localTime(end, off)); ok {
		best, found = instant(w, off), true
	}
	if c.wall && !seg.start.IsZero() && seg.prevOffset < off {
		// The clocks went forward: the local times of the gap read with
		// the offset before it (02:30 EST is 03:30 EDT).
		prev := seg.prevOffset
		gapFrom := localTime(seg.start, prev)
		if after := afterSecond(localTime(t, prev)); after.After(gapFrom) {
			gapFrom = after
		}
		if w, ok := c.spec.next(gapFrom, localTime(seg.start, off)); ok {
			if at := instant(w, prev); !found || at.Before(best) {
				best, found = at, true
			}
		}
	}
	return best, found
}

// localTime returns the local time of instant t at offset off (seconds
// east of UTC), held in a UTC time.Time.
func localTime(t time.Time, off int) time.Time {
	return t.UTC().Add(time.Duration(off) * time.Second)
}

// instant is the inverse of localTime.
func instant(local time.Time, off int) time.Time {
	return local.Add(-time.Duration(off) * time.Second)
}

// afterSecond returns the first whole second strictly after t.
func afterSecond(t time.Time) time.Time {
	return t.Truncate(time.Second).Add(time.Second)
}
