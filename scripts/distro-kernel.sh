#!/usr/bin/env bash
# distro-kernel.sh: fetch and unpack Debian's own kernel for a kernel base,
# the newest linux-image-<KBASE>*-amd64-unsigned package apt knows, and
# print the directory it is unpacked in (boot/vmlinuz-REL and
# lib/modules/REL with depmod's index). `ovlvm run -kernel distro` and
# `ovlvm test -stock distro` call it.
#
#   KBASE=6.12 scripts/distro-kernel.sh          # newest for the base
#   DISTRO_PKG=linux-image-6.1.0-57-amd64-unsigned scripts/distro-kernel.sh
#
# Unpacked packages are cached in $CACHE/distro/PACKAGE_VERSION (the layout
# vm.ExtractDeb uses for `-modules FILE.deb`), the .deb files in
# $CACHE/distro/debs. A cached package is used without downloading again.
# Progress goes to stderr, the directory alone to stdout.
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

[ $# -eq 0 ] || die "usage: [KBASE=6.1|6.12] [DISTRO_PKG=NAME] $0"

# The unsigned image carries the same kernel and modules as the signed one
# without the shim-signed boot chain; the cloud and rt flavours are other
# configurations.
candidates() {
	apt-cache search --names-only "^linux-image-${KBASE//./\\.}[.-].*-amd64-unsigned\$" |
		awk '{print $1}' | grep -Ev -- '-(cloud|rt)-amd64-unsigned$' | sort -V || true
}

pkg=${DISTRO_PKG:-}
if [ -z "$pkg" ]; then
	list=$(candidates)
	if [ -z "$list" ]; then
		say "no linux-image-$KBASE package in apt's lists; apt-get update"
		apt-get update -q >/dev/null || die "apt-get update failed"
		list=$(candidates)
	fi
	[ -n "$list" ] || die "apt knows no linux-image-$KBASE*-amd64-unsigned package"
	pkg=$(tail -n 1 <<<"$list")
fi
ver=$(apt-cache show --no-all-versions "$pkg" 2>/dev/null | sed -n 's/^Version: //p' | head -n 1)
[ -n "$ver" ] || die "apt has no version of $pkg (apt-get update?)"

root=$CACHE/distro/${pkg}_$ver
if [ -f "$root/.ovlkit-complete" ]; then
	say "$pkg $ver (cached)"
	echo "$root"
	exit 0
fi

debs=$CACHE/distro/debs
mkdir -p "$debs"
deb=$debs/${pkg}_${ver//:/%3a}_amd64.deb
if [ ! -f "$deb" ]; then
	say "downloading $pkg $ver"
	# apt-get download writes to the current directory; the _apt
	# sandbox user cannot write to a root-owned cache, which only costs
	# a warning.
	(cd "$debs" && apt-get download -q "$pkg=$ver" >/dev/null 2>"$debs/download.log") ||
		die "apt-get download $pkg=$ver failed: $(tail -n 3 "$debs/download.log")"
	if [ ! -f "$deb" ]; then
		for f in "$debs/${pkg}_"*.deb; do deb=$f; done
	fi
	[ -f "$deb" ] || die "apt-get download $pkg=$ver left no .deb in $debs"
fi

tmp=$(mktemp -d "$CACHE/distro/.extract-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
say "unpacking $(basename "$deb")"
dpkg-deb -x "$deb" "$tmp"
# The package ships no modules.dep: its postinst runs depmod.
depmod=$(command -v depmod || echo /usr/sbin/depmod)
for d in "$tmp"/lib/modules/*; do
	"$depmod" -b "$tmp" "$(basename "$d")"
done
echo "$pkg $ver" >"$tmp/.ovlkit-complete"
rm -rf "$root"
mv "$tmp" "$root"
trap - EXIT
say "$pkg $ver unpacked"
echo "$root"
