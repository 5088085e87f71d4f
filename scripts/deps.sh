#!/usr/bin/env bash
# Install the Debian packages ovlkit needs, only those that are missing.
# The kernel source is that of the base KBASE (default 6.1).
. "$(dirname "$0")/lib.sh"

pkgs=(
	"$SOURCE_PKG" quilt make gcc flex bison bc cpio xz-utils
	libelf-dev libssl-dev ccache rsync kmod sparse
	qemu-system-x86 e2fsprogs xfsprogs btrfs-progs dosfstools
	shellcheck
)

missing=()
for p in "${pkgs[@]}"; do
	if ! dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done

if [ "${#missing[@]}" -gt 0 ]; then
	[ "$(id -u)" -eq 0 ] || die "missing packages (${missing[*]}); run as root or install them"
	say "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	log=$(mktemp)
	if ! { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
		tail -n 20 "$log" >&2
		die "apt-get could not install: ${missing[*]}"
	fi
	rm -f "$log"
fi

command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ] ||
	die "go is not installed (need Go 1.26 at /usr/local/go or on PATH)"
say "dependencies present"
