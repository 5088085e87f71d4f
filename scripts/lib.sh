# Shared shell helpers for ovlkit's scripts. Sourced, not executed.
# shellcheck shell=bash

set -euo pipefail

# shellcheck disable=SC2034 # for the scripts that source this file
OVLKIT_TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ovlkit}
# The kernel base: Debian's linux-source-$KBASE and the series in
# patches/$KBASE. The Makefile exports it; 6.1 when a script runs alone.
KBASE=${KBASE:-6.1}
case $KBASE in
*[!0-9.]* | '' | .* | *.) printf 'error: KBASE=%s is not a version like 6.1\n' "$KBASE" >&2 && exit 1 ;;
esac
SOURCE_PKG=linux-source-$KBASE
# The quilt series of the base (SERIES_DIR= points at another one).
SERIES_DIR=${SERIES_DIR:-$OVLKIT_TOP/patches/$KBASE}

# series_patches: the patch files of the series, in order: the first word
# of every line that is neither blank nor a comment, as quilt reads it.
series_patches() {
	awk '!/^[[:space:]]*(#|$)/ {print $1}' "$SERIES_DIR/series"
}

_t0=$(date +%s)

# say: one progress line, prefixed with the elapsed time of this script.
say() {
	local now
	now=$(date +%s)
	printf '[%4ds] %s\n' "$((now - _t0))" "$*" >&2
}

die() {
	printf 'error: %s\n' "$*" >&2
	exit 1
}

# phase NAME LOG CMD...: run CMD with its output in LOG, print one line when
# it starts and one when it ends, and show the end of LOG when it fails.
phase() {
	local name=$1 log=$2 start rc
	shift 2
	start=$(date +%s)
	say "$name ..."
	set +e
	"$@" >"$log" 2>&1
	rc=$?
	set -e
	phase_end "$name" "$log" "$start" "$rc"
}

# phase_end NAME LOG START RC: the last line of a phase; when RC is not 0,
# the errors and the end of LOG, and exit.
phase_end() {
	local name=$1 log=$2 start=$3 rc=$4
	if [ "$rc" -ne 0 ]; then
		printf 'error: %s failed (exit %d); last lines of %s:\n' "$name" "$rc" "$log" >&2
		# Errors first: a parallel make puts them anywhere in the log.
		grep -E 'error:|Error [0-9]|\*\*\*' "$log" | head -n 20 >&2 || true
		echo '---' >&2
		tail -n 30 "$log" >&2
		exit "$rc"
	fi
	say "$name done in $(($(date +%s) - start))s"
}

# kernel_version: the Debian version of the installed kernel source package;
# the cache is keyed by it so a point release never reuses a stale tree.
kernel_version() {
	dpkg-query -W -f '${Version}' "$SOURCE_PKG" 2>/dev/null ||
		die "$SOURCE_PKG is not installed (run scripts/deps.sh)"
}

kernel_root() {
	echo "$CACHE/linux-$(kernel_version)"
}

jobs() {
	echo $(($(nproc) + 1))
}

# kbuild_env: the build identity and compiler cache every kernel build
# shares. A fixed timestamp, user and host and a cache base directory above
# all trees make the same source compile to the same cached object in any
# tree, so the patched and bisect builds reuse the stock build's objects.
kbuild_env() {
	export KBUILD_BUILD_TIMESTAMP='Thu Jan  1 00:00:00 UTC 2026'
	export KBUILD_BUILD_USER=ovlkit KBUILD_BUILD_HOST=ovlkit
	export CCACHE_DIR=${CCACHE_DIR:-$CACHE/ccache}
	export CCACHE_BASEDIR
	CCACHE_BASEDIR=$(kernel_root)
	export CCACHE_NOHASHDIR=1
	export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-4G}
}
