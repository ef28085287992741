package web

import (
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sluice-dev/sluice/module"
)

// text is a plain cell.
func text(s string) module.PageCell { return module.PageCell{Text: s} }

// num is a cell holding an integer.
func num[N ~int16 | ~int32 | ~int64 | ~int](n N) module.PageCell {
	return module.PageCell{Text: strconv.FormatInt(int64(n), 10)}
}

// timeCell is a timestamp cell; "—" when t is nil.
func timeCell(t *time.Time) module.PageCell {
	if t == nil {
		return text("—")
	}
	return module.PageCell{Time: t}
}

// jobCell links to River UI's page of job id; "—" without one.
func jobCell(id *int64, label string) module.PageCell {
	if id == nil || *id <= 0 {
		return text("—")
	}
	return module.PageCell{JobID: *id, Text: label}
}

// statusCell is a cell coloured by status ("ok", "warn", "bad" or "").
func statusCell(s, status string) module.PageCell {
	return module.PageCell{Text: s, Status: status}
}

// longCell is free text that wraps, cut to max characters (the whole of it
// on hover).
func longCell(s string, max int) module.PageCell {
	if utf8.RuneCountInString(s) <= max {
		return module.PageCell{Text: s, Long: true}
	}
	runes := []rune(s)
	return module.PageCell{Text: string(runes[:max]) + "…", Title: s, Long: true}
}

// seconds converts a count of seconds from SQL to a duration.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Age formats a duration for people, to the second under an hour and
// coarser above: "42s", "5m12s", "3h05m", "4d02h".
func Age(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d < time.Minute:
		if d < time.Second && d > 0 {
			return fmt.Sprintf("%dms", d.Milliseconds())
		}
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	default:
		return fmt.Sprintf("%dd%02dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
	}
}

// relative says how far t is from now: "5m12s ago", "in 42s", "now".
func relative(t, now time.Time) string {
	d := now.Sub(t)
	switch {
	case d > -time.Second && d < time.Second:
		return "now"
	case d > 0:
		return Age(d) + " ago"
	default:
		return "in " + Age(-d)
	}
}

// timestampFormat shows times in UTC, to the second.
const timestampFormat = "2006-01-02 15:04:05Z"

// shortTime shows t in UTC, without its date when that is now's.
func shortTime(t, now time.Time) string {
	t, now = t.UTC(), now.UTC()
	if t.YearDay() == now.YearDay() && t.Year() == now.Year() {
		return t.Format("15:04:05Z")
	}
	return t.Format(timestampFormat)
}
