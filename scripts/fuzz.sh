#!/usr/bin/env bash
# Run every Fuzz target of the repository, one after the other.
#
#   scripts/fuzz.sh TIME    each target for TIME (go test -fuzztime)
#
# The targets make and remove thousands of small trees, so they run with
# TMPDIR in FUZZ_TMPDIR (tmpfs where there is one: on a disk filesystem a
# busy journal stalls every removal).
#
# A target fails when go test fails. One failure is not the target's: Go
# before 1.27 can end a time-limited fuzz run with "context deadline
# exceeded" when a worker is still busy as -fuzztime runs out, a race in
# its fuzzing coordinator (https://go.dev/issue/75804) that a loaded host
# hits now and then. It writes no failing input. Such a run is started once
# more; a failure that writes an input, or repeats, fails.
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"

time=${1:?usage: fuzz.sh TIME}
cd "$OVLKIT_TOP"

# targets: "DIR:FuzzName" for every fuzz target, sorted.
targets() {
	grep -ro --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*' . |
		sed -n 's|^\./\(.*\)/[^/]*:func \(Fuzz.*\)|\1:\2|p' | sort -u
}

# corpus DIR NAME: the failing inputs go test has written for NAME.
corpus() {
	[ ! -d "$1/testdata/fuzz/$2" ] || find "$1/testdata/fuzz/$2" -type f | sort
}

# fuzz_once DIR NAME LOG: one go test -fuzz run, its output on the terminal
# and in LOG.
fuzz_once() {
	local rc
	set +e
	TMPDIR=$tmp go test -run '^$' -fuzz "^$2\$" -fuzztime "$time" "./$1" 2>&1 | tee "$3"
	rc=${PIPESTATUS[0]}
	set -e
	return "$rc"
}

# coordinator_race LOG BEFORE DIR NAME: whether a failed run is the Go
# coordinator's race: its only complaint is the deadline and it wrote no
# input.
coordinator_race() {
	grep -q '^    context deadline exceeded$' "$1" &&
		! grep -q -e '^    --- FAIL' -e 'Failing input written' "$1" &&
		[ "$(corpus "$3" "$4")" = "$2" ]
}

tmp=$(mktemp -d "${FUZZ_TMPDIR:-${TMPDIR:-/tmp}}/ovlkit-fuzz.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mapfile -t all < <(targets)
n=0
for t in "${all[@]}"; do
	n=$((n + 1))
	dir=${t%%:*} name=${t#*:} start=$(date +%s)
	echo "fuzz [$n/${#all[@]}] ./$dir $name for $time"
	before=$(corpus "$dir" "$name")
	if ! fuzz_once "$dir" "$name" "$tmp/log"; then
		coordinator_race "$tmp/log" "$before" "$dir" "$name" ||
			die "fuzz: $name failed; the failing input is under ./$dir/testdata/fuzz/$name"
		echo "fuzz: $name: go's coordinator ended the run with a deadline error and no failing input (go.dev/issue/75804); running it again"
		fuzz_once "$dir" "$name" "$tmp/log" ||
			die "fuzz: $name failed twice; the failing input, if any, is under ./$dir/testdata/fuzz/$name"
	fi
	echo "fuzz [$n/${#all[@]}] $name: passed in $(($(date +%s) - start))s"
done
