#!/usr/bin/env bash
# torture-mutants.sh — the torture test's mutation suite: each patch in
# limiter/torture/mutants/ breaks one promise of the limiter on purpose; the
# torture test must catch it. For each patch (or those named as arguments),
# on a copy of HEAD (a git worktree in a temporary directory), it applies
# the patch, runs the torture test for MUTANT_DURATION (default 90s; seeds
# one after the other, as make torture does) and reports which checks fired
# in which seeds. A mutant is caught when the check its patch expects
# (its first line, "expect: <check>") reports a violation, or when the
# deterministic scenario it names (an optional second line,
# "scenario: <TestName>", a test of limiter/torture) fails on the mutant
# after passing on HEAD (run first; a scenario that fails on HEAD counts for
# nothing).
#
# MUTANT_LOGS=DIR keeps each mutant's torture log there (<mutant>.log).
#
# Exit 0 when every mutant was caught, 1 when one was missed (or caught
# only by another check), 2 on bad usage. The database comes from
# TEST_DATABASE_URL, as for make test (make torture-mutants sets it).
set -euo pipefail
# The torture package runs against real workers only when asked.
export TORTURE=1

root=$(git rev-parse --show-toplevel)
cd "$root"
duration=${MUTANT_DURATION:-90s}
GO=${GO:-go}

patches=()
if [ $# -eq 0 ]; then
	patches=(limiter/torture/mutants/*.patch)
else
	for name in "$@"; do
		p=limiter/torture/mutants/${name%.patch}.patch
		[ -f "$p" ] || { echo "torture-mutants: no mutant $name (see limiter/torture/mutants/)" >&2; exit 2; }
		patches+=("$p")
	done
fi

work=$(mktemp -d)
cleanup() {
	git worktree remove --force "$work/tree" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

missed=0
results=()
for p in "${patches[@]}"; do
	name=$(basename "$p" .patch)
	expect=$(sed -n '1s/^expect: *//p' "$p")
	[ -n "$expect" ] || { echo "torture-mutants: $p has no 'expect: <check>' first line" >&2; exit 2; }
	git worktree remove --force "$work/tree" >/dev/null 2>&1 || true
	git worktree add --detach --quiet "$work/tree" HEAD
	scenario=$(sed -n '2s/^scenario: *//p' "$p")
	scenarioVerdict=""
	scode=0
	if [ -n "$scenario" ]; then
		# The scenario must pass on HEAD, or its failure on the mutant tells
		# nothing.
		set +e
		(cd "$work/tree" && $GO test -count=1 -timeout 0 -run "^$scenario\$" ./limiter/torture/) >"$work/$name.head.log" 2>&1
		hcode=$?
		set -e
	fi
	(cd "$work/tree" && git apply "$root/$p")
	# A patch may ask for a longer run (a "duration: <Go duration>" line
	# among its first lines): its fault shows in fewer seeds. MUTANT_DURATION
	# set by the caller runs every mutant for that long.
	mutantDuration=$duration
	if [ -z "${MUTANT_DURATION:-}" ]; then
		own=$(sed -n '1,4s/^duration: *//p' "$p")
		mutantDuration=${own:-$duration}
	fi
	echo "== mutant $name (expect: $expect), $mutantDuration of torture"
	log=$work/$name.log
	set +e
	(cd "$work/tree" && TORTURE_DURATION=$mutantDuration $GO test -count=1 -timeout 0 -v -run '^TestTorture$' ./limiter/torture/) >"$log" 2>&1
	code=$?
	set -e
	if [ -n "$scenario" ] && [ "$hcode" -ne 0 ]; then
		scenarioVerdict="$scenario fails on HEAD too (not counted)"
	elif [ -n "$scenario" ]; then
		set +e
		(cd "$work/tree" && $GO test -count=1 -timeout 0 -v -run "^$scenario\$" ./limiter/torture/) >"$log.scenario" 2>&1
		scode=$?
		set -e
		if [ "$scode" -ne 0 ]; then
			scenarioVerdict="$scenario failed: $(grep -m1 -E '^\s+\S+_test.go:[0-9]+: ' "$log.scenario" | sed 's/^ *//' | cut -c1-160)"
		else
			scenarioVerdict="$scenario passed"
		fi
	fi
	if [ -n "${MUTANT_LOGS:-}" ]; then
		mkdir -p "$MUTANT_LOGS"
		cp "$log" "$MUTANT_LOGS/$name.log"
		[ ! -f "$log.scenario" ] || cp "$log.scenario" "$MUTANT_LOGS/$name.scenario.log"
	fi
	summary=$(grep -A1 '^TORTURE SUMMARY:' "$log" | tail -1 || true)
	fired=$(sed -n 's/.*; violations [0-9]* (\(.*\))$/\1/p' <<<"$summary")
	seeds=$(sed -n 's/.*--- FAIL: TestTorture\/seed=\([0-9]*\).*/\1/p' "$log" | paste -sd, -)
	all=$(grep -c -- '--- \(PASS\|FAIL\): TestTorture/seed=' "$log" || true)
	if [ -z "$summary" ]; then
		verdict="no result (exit $code; see below)"
		tail -30 "$log"
		missed=1
	elif grep -qE "(^|, )$expect [0-9]+" <<<"$fired"; then
		verdict="caught by $expect in seeds ${seeds:-?} of $all: $fired"
	elif [ "$scode" -ne 0 ]; then
		verdict="caught by $scenarioVerdict; the seeds ($all): ${fired:-none}"
	elif [ "$code" -ne 0 ]; then
		verdict="caught by another check only, in seeds ${seeds:-?} of $all: ${fired:-none}"
		missed=1
	else
		verdict="MISSED in $all seeds"
		missed=1
	fi
	[ -z "$scenarioVerdict" ] || [[ "$verdict" == *"$scenario"* ]] || verdict="$verdict; $scenarioVerdict"
	echo "   $verdict"
	results+=("$(printf '%-28s %-11s %s' "$name" "$expect" "$verdict")")
done

echo
echo "mutants ($duration each):"
printf '  %s\n' "${results[@]}"
exit $missed
