package scheduler

// SpecSets returns what a 5- or 6-field expression matches, for the
// comparison with robfig/cron's parser: the value bits of the second,
// minute, hour, day-of-month, month and day-of-week fields, and whether
// each day field is * (or ?). ok is false for @every.
func SpecSets(c *Cron) (bits [6]uint64, domStar, dowStar, ok bool) {
	s := c.spec
	if s == nil {
		return bits, false, false, false
	}
	return [6]uint64{s.second, s.minute, s.hour, s.dom, s.month, s.dow}, s.domStar, s.dowStar, true
}
