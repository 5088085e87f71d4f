#!/bin/bash
# systemd-run --scope and systemctl stop for the xfstests guest, which has
# no systemd. xfstests' check runs each test in a transient scope when
# "systemd-run --scope" works and stops the scope after the test, which
# kills whatever the test left running: overlay/058 leaves open_by_handle
# sleeping with files open on the overlay, and without the stop its mount
# stays busy and every later test fails to unmount it. Here a scope is a
# session: systemd-run starts the command as a session leader and records
# the session's ID under the unit's name; systemctl stop kills every
# process of that session. A process that starts a session of its own
# escapes, where a cgroup would keep it.
#
# Installed as /usr/local/bin/systemd-run, with systemctl and
# systemd-escape links to it. Takes what check passes: systemd-escape
# NAME, systemd-run --quiet --unit UNIT --scope CMD..., systemctl
# reset-failed UNIT, systemctl stop UNIT. Every other systemctl command
# fails, so tests that need a running systemd stay not run.
set -u
dir=${OVLKIT_SCOPE_DIR:-/run/ovlkit-scopes}

# alive SID: whether a process of the session is still running (a killed
# one may stay a zombie until its new parent reaps it).
alive() {
	# shellcheck disable=SC2009 # pgrep cannot leave zombies out
	ps -s "$1" -o stat= 2>/dev/null | grep -qv '^Z'
}

case ${0##*/} in
systemd-escape)
	# What check needs of it: a unit name without "/" for a test's name,
	# the one systemd gives ("fsoverlay/058" is "fsoverlay-058").
	[ $# = 1 ] || { echo "systemd-escape: one name only" >&2; exit 1; }
	name=${1//-/\\x2d}
	printf '%s\n' "${name//\//-}"
	;;
systemd-run)
	unit="" scope=0
	while [ $# -gt 0 ]; do
		case $1 in
		-q | --quiet) shift ;;
		--scope) scope=1; shift ;;
		--unit) unit=${2-}; shift 2 || exit 1 ;;
		--unit=*) unit=${1#--unit=}; shift ;;
		--) shift; break ;;
		-*) echo "systemd-run: unsupported option $1" >&2; exit 1 ;;
		*) break ;;
		esac
	done
	if [ "$scope" = 0 ] || [ -z "$unit" ] || [ "$unit" != "${unit//\//}" ] || [ $# = 0 ]; then
		echo "systemd-run: only --unit UNIT --scope COMMAND... is supported" >&2
		exit 1
	fi
	mkdir -p "$dir" || exit 1
	# setsid makes the command a session leader (forking first, and
	# waiting with -w, when this process leads a process group), so the
	# PID the command records is its session's ID.
	# shellcheck disable=SC2016 # expanded by the inner shell
	exec setsid -w bash -c 'echo $$ >"$1" && shift && exec "$@"' scope "$dir/$unit" "$@"
	;;
systemctl)
	case ${1-} in
	reset-failed) exit 0 ;;
	stop)
		unit=${2-}
		[ -n "$unit" ] && [ "$unit" = "${unit//\//}" ] || exit 1
		[ -f "$dir/$unit" ] || exit 5 # systemctl's "unit not loaded"
		sid=$(cat "$dir/$unit")
		rm -f "$dir/$unit"
		case $sid in '' | 0 | 1 | *[!0-9]*) exit 1 ;; esac
		pkill -KILL -s "$sid"
		for _ in $(seq 100); do
			alive "$sid" || exit 0
			sleep 0.1
		done
		echo "systemctl: processes of $unit (session $sid) outlived SIGKILL" >&2
		exit 1
		;;
	*) exit 1 ;;
	esac
	;;
*)
	echo "${0##*/}: run as systemd-run, systemctl or systemd-escape" >&2
	exit 1
	;;
esac
