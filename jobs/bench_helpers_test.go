package jobs_test

import (
	"cmp"
	"slices"
)

// median is the middle value of xs (the upper one for an even count).
func median[T cmp.Ordered](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
