package scheduler

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// cronField describes one field of a 5- or 6-field cron expression.
type cronField struct {
	name string
	// min and max bound the values; last is where * and N/S end (for the
	// day of the week, 6: 7 is another name for Sunday, 0).
	min, max, last int
	// names are the month or weekday names the field accepts.
	names map[string]int
	// dom and dow mark the day fields (L, N#k and ? are theirs).
	dom, dow bool
}

// cronFields returns the fields of an expression of n fields (5 or 6).
func cronFields(n int) []cronField {
	months := map[string]int{"jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6,
		"jul": 7, "aug": 8, "sep": 9, "oct": 10, "nov": 11, "dec": 12}
	days := map[string]int{"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
	fields := []cronField{
		{name: "second", min: 0, max: 59, last: 59},
		{name: "minute", min: 0, max: 59, last: 59},
		{name: "hour", min: 0, max: 23, last: 23},
		{name: "day-of-month", min: 1, max: 31, last: 31, dom: true},
		{name: "month", min: 1, max: 12, last: 12, names: months},
		{name: "day-of-week", min: 0, max: 7, last: 6, names: days, dow: true},
	}
	return fields[6-n:]
}

// fieldSet is a parsed field.
type fieldSet struct {
	bits uint64
	// star: the field is (or holds) * or ?, with no step above 1.
	star bool
	// last: L in the day of the month.
	last bool
	// nth: N#k in the day of the week.
	nth [7]uint8
}

// parseSpec parses the fields of a 5- or 6-field expression. An error
// names the field at fault and why.
func parseSpec(fields []string) (*cronSpec, error) {
	defs := cronFields(len(fields))
	sets := make([]fieldSet, 6)
	// A 5-field expression runs at second 0.
	sets[0] = fieldSet{bits: 1}
	for i, text := range fields {
		f := defs[i]
		set, err := f.parse(text)
		if err != nil {
			return nil, fmt.Errorf("%s field %q: %w", f.name, text, err)
		}
		sets[6-len(fields)+i] = set
	}
	return &cronSpec{
		second:  sets[0].bits,
		minute:  sets[1].bits,
		hour:    sets[2].bits,
		dom:     sets[3].bits,
		lastDom: sets[3].last,
		domStar: sets[3].star,
		month:   sets[4].bits,
		dow:     sets[5].bits,
		nthDow:  sets[5].nth,
		dowStar: sets[5].star,
	}, nil
}

// parse parses a field: a comma-separated list of items.
func (f cronField) parse(text string) (fieldSet, error) {
	var set fieldSet
	for item := range strings.SplitSeq(text, ",") {
		if err := f.parseItem(item, &set); err != nil {
			return fieldSet{}, err
		}
	}
	return set, nil
}

// parseItem adds one list item to set: *, ?, L, N#k, V, A-B, each of *,
// V and A-B with an optional /STEP.
func (f cronField) parseItem(item string, set *fieldSet) error {
	switch {
	case item == "":
		return errors.New("empty list item (two commas in a row, or a comma at an end)")
	case item == "?":
		if !f.dom && !f.dow {
			return errors.New("? (any day) is allowed only in the day-of-month and day-of-week fields")
		}
		set.bits |= bitRange(f.min, f.last, 1)
		set.star = true
		return nil
	case strings.EqualFold(item, "L"):
		if !f.dom {
			return errors.New("L (the last day of the month) is allowed only in the day-of-month field")
		}
		set.last = true
		return nil
	case strings.Contains(item, "#"):
		if !f.dow {
			return errors.New("N#k (the k-th weekday N of the month) is allowed only in the day-of-week field")
		}
		return f.parseNth(item, set)
	case strings.HasPrefix(item, "?"):
		return errors.New("? takes no range or step: write ? alone")
	case f.dom && strings.ContainsAny(item, "Ll"):
		return errors.New("L takes no offset, range or step: write L alone (the last day of the month)")
	case f.dom && (strings.HasSuffix(item, "W") || strings.HasSuffix(item, "w")):
		return errors.New("W (the nearest weekday) is not supported")
	case f.dow && (strings.HasSuffix(item, "L") || strings.HasSuffix(item, "l")):
		return errors.New("NL (the last weekday N of the month) is not supported: N#5 is the fifth, in the months that have one")
	}

	rng, stepText, hasStep := strings.Cut(item, "/")
	step := 1
	if hasStep {
		n, err := strconv.Atoi(stepText)
		if err != nil || !isDigits(stepText) {
			return fmt.Errorf("step %q is not a number", stepText)
		}
		// A step above the field's count of values could never repeat.
		if count := f.last - f.min + 1; n < 1 || n > count {
			return fmt.Errorf("step %d out of range: want 1 to %d", n, count)
		}
		step = n
	}
	var lo, hi int
	switch a, b, isRange := strings.Cut(rng, "-"); {
	case rng == "*":
		lo, hi = f.min, f.last
		if step == 1 {
			set.star = true
		}
	case isRange:
		var err error
		if lo, err = f.value(a); err != nil {
			return err
		}
		if hi, err = f.value(b); err != nil {
			return err
		}
		if lo > hi {
			return fmt.Errorf("range %s-%s runs backwards (%d is after %d)", a, b, lo, hi)
		}
	default:
		var err error
		if lo, err = f.value(rng); err != nil {
			return err
		}
		hi = lo
		if hasStep {
			// N/S: from N to the end of the field, every S.
			hi = max(f.last, lo)
		}
	}
	bits := bitRange(lo, hi, step)
	if f.dow && bits&(1<<7) != 0 {
		// 7 is Sunday.
		bits = bits&^(1<<7) | 1
	}
	set.bits |= bits
	return nil
}

// parseNth parses N#k into set.nth.
func (f cronField) parseNth(item string, set *fieldSet) error {
	day, kText, _ := strings.Cut(item, "#")
	wd, err := f.value(day)
	if err != nil {
		return fmt.Errorf("in %q: %w", item, err)
	}
	k, err := strconv.Atoi(kText)
	if err != nil || !isDigits(kText) || k < 1 || k > 5 {
		return fmt.Errorf("in %q: k must be 1 to 5 (the k-th such weekday of the month), got %q", item, kText)
	}
	set.nth[wd%7] |= 1 << (k - 1)
	return nil
}

// value parses a number or a name of the field and checks its range.
func (f cronField) value(s string) (int, error) {
	if v, ok := f.names[strings.ToLower(s)]; ok {
		return v, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || !isDigits(s) {
		switch {
		case s == "":
			return 0, errors.New("missing value (a range needs both ends: A-B)")
		case f.dow:
			return 0, fmt.Errorf("%q is not a number or a day name (sun to sat)", s)
		case f.names != nil:
			return 0, fmt.Errorf("%q is not a number or a month name (jan to dec)", s)
		case strings.Contains(s, "-"):
			return 0, fmt.Errorf("%q is not a range: want A-B", s)
		default:
			return 0, fmt.Errorf("%q is not a number", s)
		}
	}
	if n < f.min || n > f.max {
		if f.dow {
			return 0, fmt.Errorf("%d out of range: want %d to %d (0 and 7 are Sunday)", n, f.min, f.max)
		}
		return 0, fmt.Errorf("%d out of range: want %d to %d", n, f.min, f.max)
	}
	return n, nil
}

// isDigits reports whether s is a non-empty run of ASCII digits (no sign).
func isDigits(s string) bool {
	if s == "" || len(s) > 9 {
		return false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// bitRange sets the bits lo, lo+step, ... up to hi.
func bitRange(lo, hi, step int) uint64 {
	var b uint64
	for v := lo; v <= hi; v += step {
		b |= 1 << v
	}
	return b
}
