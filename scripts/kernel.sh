#!/usr/bin/env bash
# Kernel source, series, configuration and build for ovlkit.
#
#   scripts/kernel.sh source            extract the pristine tree
#   scripts/kernel.sh patch             refresh the patched tree from the series
#   scripts/kernel.sh build TREE        configure and build TREE (stock|patched)
#   scripts/kernel.sh path TREE         print the bzImage path of TREE
#   scripts/kernel.sh devtree NAME      make a git tree NAME for patch work:
#                                       pristine source, one commit per patch
#                                       of the series (git am); build it with
#                                       "kernel.sh build NAME"
#
# Environment: KBASE (kernel base, default 6.1: source package
# linux-source-$KBASE, series patches/$KBASE), CACHE (cache root),
# KCONFIG_EXTRA (extra fragments from kconfig/, e.g. "debug"), V=1 (show the
# build output), JOBS.
. "$(dirname "$0")/lib.sh"

ROOT=$(kernel_root)
# kconfig/$KBASE.config, when present, holds what this base needs beyond
# guest and overlay (symbols renamed or newly gated since 6.1); it is merged
# after them and before the extra fragments. It is not part of the build
# directory's name: the cache already keeps each base apart. An extra
# fragment NAME may have a part for one base only, kconfig/NAME-$KBASE.config
# (symbols that base has and others do not), merged after all the others.
BASE_FRAGMENT=()
if [ -f "$OVLKIT_TOP/kconfig/$KBASE.config" ]; then
	BASE_FRAGMENT=("$KBASE")
fi
# shellcheck disable=SC2206 # KCONFIG_EXTRA is a list of names
EXTRA_FRAGMENTS=(${KCONFIG_EXTRA:-})
FRAGMENTS=(guest overlay "${EXTRA_FRAGMENTS[@]}")

kbuild_env

src_dir() { echo "$ROOT/$1/src"; }

config_name() {
	local IFS=+
	echo "${FRAGMENTS[*]}"
}

obj_dir() { echo "$ROOT/$1/obj-$(config_name)"; }

cmd_source() {
	local src
	src=$(src_dir stock)
	if [ -f "$src/.ovlkit-extracted" ]; then
		return 0
	fi
	local tarball=/usr/src/$SOURCE_PKG.tar.xz
	[ -f "$tarball" ] || die "$tarball not found (install $SOURCE_PKG)"
	rm -rf "$src" "$src.tmp"
	mkdir -p "$src.tmp"
	phase "extract $SOURCE_PKG $(kernel_version)" "$ROOT/extract.log" \
		tar -xf "$tarball" -C "$src.tmp" --strip-components=1
	touch "$src.tmp/.ovlkit-extracted"
	mv "$src.tmp" "$src"
}

series_stamp() {
	(
		cd "$SERIES_DIR"
		# shellcheck disable=SC2046
		sha256sum series $(series_patches)
	) | sha256sum | cut -c1-16
}

# Print the rejected hunks of the patch quilt could not push, then fail.
# quilt rolls the failed patch back, so it is applied again at fuzz 0 to a
# scratch copy of the files it touches, with every reject in one file.
report_reject() {
	local dst=$1 log=$2 name tmp f
	name=$(grep -o "Applying patch .*" "$log" | tail -n 1 | sed 's/Applying patch //' || true)
	printf 'error: patch %s does not apply to %s %s\n' "${name:-?}" \
		"$SOURCE_PKG" "$(kernel_version)" >&2
	sed -n '/Applying patch/,$p' "$log" | tail -n 20 >&2
	if [ -n "$name" ] && [ -f "$SERIES_DIR/$name" ]; then
		tmp=$(mktemp -d)
		sed -n 's|^+++ b/\([^\t]*\).*|\1|p' "$SERIES_DIR/$name" | while read -r f; do
			if [ -f "$dst/$f" ]; then
				mkdir -p "$tmp/$(dirname "$f")"
				cp "$dst/$f" "$tmp/$f"
			fi
		done
		patch -p1 -F0 -s -d "$tmp" -r "$tmp/rejects" <"$SERIES_DIR/$name" >/dev/null 2>&1 || true
		if [ -s "$tmp/rejects" ]; then
			printf '\n--- rejected hunks of %s:\n' "$name" >&2
			cat "$tmp/rejects" >&2
		fi
		rm -rf "$tmp"
	fi
	rm -f "$dst/.ovlkit-series"
	exit 1
}

cmd_patch() {
	cmd_source
	local src dst stamp
	src=$(src_dir stock)
	dst=$(src_dir patched)
	[ -f "$SERIES_DIR/series" ] || die "$SERIES_DIR/series not found"
	stamp=$(series_stamp)
	if [ -f "$dst/.ovlkit-series" ] && [ "$(cat "$dst/.ovlkit-series")" = "$stamp" ]; then
		say "patched tree is current (series $stamp)"
		return 0
	fi
	mkdir -p "$dst"
	rm -f "$dst/.ovlkit-series"
	# Resync from the pristine tree by content (-c) and without keeping
	# times: only files that differ are rewritten, and they get a fresh
	# mtime, so make rebuilds exactly what changed, including a file
	# reverted to its pristine content.
	say "syncing patched tree from pristine"
	rm -rf "$dst/.pc"
	rsync -rlpgoDc --delete --exclude=/.pc --exclude=/.ovlkit-series "$src/" "$dst/"
	local n
	n=$(series_patches | wc -l)
	if [ "$n" -gt 0 ]; then
		local log=$ROOT/quilt.log
		say "applying $n patches from ${SERIES_DIR#"$OVLKIT_TOP"/}/series"
		if ! (cd "$dst" && QUILT_PATCHES=$SERIES_DIR quilt --quiltrc=- push -a --fuzz=0) >"$log" 2>&1; then
			report_reject "$dst" "$log"
		fi
		say "applied: $(grep -c '^Applying patch' "$log") patches"
	else
		say "series is empty: patched tree equals the stock tree"
	fi
	echo "$stamp" >"$dst/.ovlkit-series"
}

cmd_config() {
	local tree=$1 src obj frags=() f
	src=$(src_dir "$tree")
	obj=$(obj_dir "$tree")
	mkdir -p "$obj"
	for f in guest overlay "${BASE_FRAGMENT[@]}" "${EXTRA_FRAGMENTS[@]}"; do
		[ -f "$OVLKIT_TOP/kconfig/$f.config" ] || die "kconfig/$f.config not found"
		frags+=("$OVLKIT_TOP/kconfig/$f.config")
	done
	for f in "${EXTRA_FRAGMENTS[@]}"; do
		if [ -f "$OVLKIT_TOP/kconfig/$f-$KBASE.config" ]; then
			frags+=("$OVLKIT_TOP/kconfig/$f-$KBASE.config")
		fi
	done
	local stamp
	stamp=$(cat "${frags[@]}" | sha256sum | cut -c1-16)
	if [ -f "$obj/.config" ] && [ "$(cat "$obj/.ovlkit-config" 2>/dev/null)" = "$stamp" ]; then
		return 0
	fi
	phase "configure $tree ($(config_name))" "$obj/config.log" \
		env -C "$src" ARCH=x86_64 KCONFIG_CONFIG="$obj/.config" \
		scripts/kconfig/merge_config.sh -n -O "$obj" "${frags[@]}"
	local checked=("${frags[@]}")
	if [ "${#BASE_FRAGMENT[@]}" -gt 0 ]; then
		# The base fragment replaces what guest and overlay ask for the
		# symbols it sets (merge_config.sh lets the later value win), so
		# kconfigcheck gets those two without them.
		local base=$OVLKIT_TOP/kconfig/$KBASE.config syms
		syms=$(sed -n -e 's/^\(CONFIG_[A-Za-z0-9_]*\)=.*/\1/p' \
			-e 's/^# \(CONFIG_[A-Za-z0-9_]*\) is not set$/\1/p' "$base")
		[ -n "$syms" ] || die "kconfig/$KBASE.config sets no symbol"
		mkdir -p "$obj/requested"
		checked=()
		for f in "${frags[@]}"; do
			case $(basename "$f" .config) in
			guest | overlay)
				grep -vwF -e "$syms" "$f" >"$obj/requested/$(basename "$f")" || true
				checked+=("$obj/requested/$(basename "$f")")
				;;
			*) checked+=("$f") ;;
			esac
		done
	fi
	(cd "$OVLKIT_TOP" && go run ./tools/kconfigcheck -config "$obj/.config" "${checked[@]}") ||
		die "kernel configuration for $tree lost requested symbols (see above; full log: $obj/config.log)"
	echo "$stamp" >"$obj/.ovlkit-config"
}

# lock_tree TREE: one build of a tree at a time; a second caller waits.
lock_tree() {
	mkdir -p "$ROOT"
	exec 9>"$ROOT/.$1.lock"
	if ! flock -n 9; then
		say "waiting for another build of the $1 tree"
		flock 9
	fi
}

cmd_build() {
	local tree=${1:?usage: kernel.sh build stock|patched}
	lock_tree "$tree"
	case $tree in
	stock) cmd_source ;;
	patched) cmd_patch ;;
	*) [ -d "$(src_dir "$tree")" ] ||
		die "unknown tree '$tree' (stock, patched, or a tree made by 'kernel.sh devtree')" ;;
	esac
	cmd_config "$tree"
	local src obj
	src=$(src_dir "$tree")
	obj=$(obj_dir "$tree")
	local args=(-C "$src" O="$obj" ARCH=x86_64 -j"${JOBS:-$(jobs)}" CC="ccache gcc" bzImage)
	if [ "${V:-0}" = 1 ]; then
		make "${args[@]}"
	else
		build_with_progress "build $tree kernel ($(config_name), ccache)" \
			"$obj/build.log" "$(expected_objects "$tree")" make "${args[@]}"
	fi
	# What the next build of this configuration compares its progress with.
	find "$obj" -name '*.o' | wc -l >"$obj/.ovlkit-objects"
	say "$tree kernel: $obj/arch/x86/boot/bzImage"
}

# expected_objects TREE: the objects a full build of TREE's configuration
# makes, for the progress line: what the last build of this tree, or of
# another tree with the same configuration, left; else the estimate in
# kconfig/objects; else 0 (unknown).
expected_objects() {
	local f
	for f in "$(obj_dir "$1")/.ovlkit-objects" "$ROOT"/*/"obj-$(config_name)/.ovlkit-objects"; do
		if [ -s "$f" ]; then
			cat "$f"
			return
		fi
	done
	awk -v base="$KBASE" -v cfg="$(config_name)" \
		'$1 == base && $2 == cfg { n = $3 } END { print n + 0 }' "$OVLKIT_TOP/kconfig/objects"
}

# build_with_progress NAME LOG EXPECT CMD...: phase for a kernel build, with
# a progress line (objects done out of EXPECT, elapsed time, estimate) drawn
# by tools/buildprogress while CMD's output goes to LOG.
build_with_progress() {
	local name=$1 log=$2 expect=$3 start rc status
	shift 3
	start=$(date +%s)
	say "$name ..."
	# Built first, so that a compile error in the tool is not taken for
	# one in the kernel.
	local tool=$CACHE/bin/buildprogress
	(cd "$OVLKIT_TOP" && go build -o "$tool" ./tools/buildprogress) ||
		die "building tools/buildprogress failed"
	set +e
	"$@" 2>&1 | "$tool" -log "$log" -name "$name" -expect "$expect"
	status=("${PIPESTATUS[@]}")
	rc=${status[0]}
	[ "$rc" -ne 0 ] || rc=${status[1]}
	set -e
	phase_end "$name" "$log" "$start" "$rc"
}

cmd_devtree() {
	local name=${1:?usage: kernel.sh devtree NAME}
	case $name in stock | patched) die "'$name' is reserved" ;; esac
	cmd_source
	local dst
	dst=$(src_dir "$name")
	[ ! -e "$dst" ] || die "$dst exists; remove it to start over"
	say "copying pristine tree to $dst"
	mkdir -p "$(dirname "$dst")"
	cp -a "$(src_dir stock)" "$dst"
	rm -f "$dst/.ovlkit-extracted"
	(
		cd "$dst"
		git init -q
		git add -f -A .
		git -c user.name=ovlkit -c user.email=ovlkit@localhost commit -q -m "$SOURCE_PKG $(kernel_version)"
		series_patches |
			while read -r p; do
				git am -q "$SERIES_DIR/$p" || die "git am $p failed in $dst"
			done
	)
	say "devtree $name ready: $dst (git log shows the series)"
}

cmd_path() {
	echo "$(obj_dir "${1:?usage: kernel.sh path stock|patched}")/arch/x86/boot/bzImage"
}

case ${1:-} in
source) cmd_source ;;
patch)
	lock_tree patched
	cmd_patch
	;;
config) cmd_config "${2:?tree}" ;;
build) cmd_build "${2:-}" ;;
path) cmd_path "${2:-}" ;;
devtree) cmd_devtree "${2:-}" ;;
*) die "usage: kernel.sh source|patch|build TREE|path TREE" ;;
esac
