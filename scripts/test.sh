#!/usr/bin/env bash
# scripts/test.sh [GO TEST FLAGS...]: the whole suite, as make test runs it.
#
# Every package but the limiter's torture test runs in one go test (two
# packages at a time on two cores); the torture test runs after them,
# alone. Its checks hold the limiter to timing tolerances stated in the
# README (a job fetched 50 ms before another by a second worker goes
# first, a change of limits reaches every worker within 50 ms): they
# measure the limiter, not the CPU a neighbouring package takes from it.
# Both runs always run; the script fails if either failed.
set -uo pipefail
go=${GO:-go}
torture=github.com/sluice-dev/sluice/limiter/torture
mapfile -t pkgs < <("$go" list ./... | grep -vx "$torture")
"$go" test -count=1 "$@" "${pkgs[@]}"
rest=$?
"$go" test -count=1 "$@" "$torture"
tortured=$?
[ "$rest" -eq 0 ] && [ "$tortured" -eq 0 ]
