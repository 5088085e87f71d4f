#!/usr/bin/env bash
# Check every patch of the series the way a kernel maintainer would, one
# patch at a time, and print one table row per patch:
#
#   checkpatch  scripts/checkpatch.pl --strict: no error, warning or check,
#               except of a type that the notes below the "---" line justify
#               with a line "checkpatch: TYPE[,TYPE...]: why" (git am drops
#               them, so they never reach a commit)
#   meta        Signed-off-by, DEP-3 fields (Origin, Forwarded, Last-Update),
#               a subject "[PATCH n/N] ovl: ..." numbered in series order,
#               and no tool directive above the "---" line
#   build       make fs/overlayfs/ succeeds with this patch and the ones
#               before it applied (the series stays bisectable)
#   W=1         no W=1 warning in fs/overlayfs that the stock tree lacks
#   sparse      no sparse (C=2) warning in fs/overlayfs that stock lacks
#
# then builds fs/overlayfs/overlay.ko once with CONFIG_OVERLAY_FS=m on the
# whole series, and checks that the cover letter names every patch.
#
# Builds happen in a "bisect" tree next to the stock and patched trees, so
# ccache serves every unchanged file; warnings are compared without line
# numbers, since the patches move code.  Exit status: 0 when every cell is
# clean.  Logs: <cache>/linux-<version>/bisect/logs/.
. "$(dirname "$0")/lib.sh"

ROOT=$(kernel_root)
TREE=bisect
SRC=$ROOT/$TREE/src
LOGS=$ROOT/$TREE/logs
STOCK_SRC=$ROOT/stock/src

# Same build identity and compiler cache as scripts/kernel.sh, so the
# objects of this tree are cache hits of the stock and patched builds.
kbuild_env

JOBS=${JOBS:-$(jobs)}
problems=0

# commit_message PATCH: the part of a format-patch file before its diffstat.
commit_message() {
	sed '/^---$/q' "$1"
}

# patch_notes PATCH: what stands between the "---" line and the diff: the
# notes for tools and reviewers and the diffstat, which git am drops.
patch_notes() {
	sed -n '/^---$/,/^diff --git /p' "$1"
}

# patch_prefix PATCH: the "[PATCH n/N]" part of the subject.
patch_prefix() {
	sed -n 's/^Subject:[[:space:]]*\(\[[^]]*\]\).*/\1/p' "$1" | head -n 1
}

# patch_subject PATCH: the Subject line without "[PATCH n/N]", unfolded.
patch_subject() {
	awk '/^Subject:/ {s = $0; getline; while ($0 ~ /^[ \t]/) {s = s $0; getline}; print s; exit}' "$1" |
		sed -e 's/^Subject:[[:space:]]*//' -e 's/^\[[^]]*\][[:space:]]*//'
}

# check_style PATCH: prints the cell for checkpatch; returns 1 on problems.
# checkpatch runs from the pristine tree, which has no .git: it then does
# not look commits up, except that a Fixes: or "commit <id>" reference is
# always reported as unknown (the tree lacks upstream history), which is
# why that type can be justified.
check_style() {
	local patch=$1 name log justified types bad=() t
	name=$(basename "$patch" .patch)
	log=$LOGS/$name.checkpatch
	(cd "$STOCK_SRC" && GIT_DIR=/nonexistent scripts/checkpatch.pl --strict --no-tree \
		--show-types --no-summary --terse "$patch") >"$log" 2>&1 || true
	# shellcheck disable=SC2020 # a comma and a space each end a type
	justified=$(patch_notes "$patch" |
		sed -n 's/^[[:space:]]*checkpatch:[[:space:]]*\([A-Z_, ]*[A-Z_]\)[[:space:]]*:[[:space:]]*[^[:space:]].*/\1/p' |
		tr ', ' '\n\n' | sed '/^$/d' | sort -u)
	types=$(sed -n 's/^[^:]*:[0-9]*: \(ERROR\|WARNING\|CHECK\):\([A-Z_0-9]*\):.*/\2/p' "$log")
	for t in $types; do
		if ! grep -qx "$t" <<<"$justified"; then
			bad+=("$t")
		fi
	done
	if [ "${#bad[@]}" -gt 0 ]; then
		echo "${#bad[@]} issues"
		return 1
	fi
	if [ -n "$types" ]; then
		echo "ok ($(wc -w <<<"$types") justified)"
	else
		echo "ok"
	fi
}

# check_meta PATCH N TOTAL: prints the cell for the patch header; returns 1
# when a required field is missing or the header is malformed.
check_meta() {
	local patch=$1 n=$2 total=$3 msg missing=()
	msg=$(commit_message "$patch")
	[ "$(patch_prefix "$patch")" = "[PATCH $n/$total]" ] || missing+=("[PATCH $n/$total]")
	! grep -q '^checkpatch:' <<<"$msg" || missing+=("directive below ---")
	grep -q '^Signed-off-by: .* <.*@.*>$' <<<"$msg" || missing+=(Signed-off-by)
	grep -q '^Origin: ' <<<"$msg" || missing+=(Origin)
	grep -q '^Forwarded: ' <<<"$msg" || missing+=(Forwarded)
	grep -q '^Last-Update: [0-9]\{4\}-[0-9][0-9]-[0-9][0-9]$' <<<"$msg" || missing+=(Last-Update)
	patch_subject "$patch" | grep -q '^ovl: ' || missing+=(subject)
	if [ "${#missing[@]}" -gt 0 ]; then
		local IFS=,
		echo "no ${missing[*]}"
		return 1
	fi
	echo ok
}

# warnings LOG: the compiler and sparse diagnostics of LOG that concern
# the overlayfs sources, as "file: message" without line and column, one
# per line, sorted, so that code moved by a patch compares equal.
# A clean build has no such lines: grep's status 1 is no error here.
warnings() {
	{ grep -E '(warning|error):' "$1" || true; } |
		{ grep -E 'fs/overlayfs/|include/' || true; } |
		sed -E -e 's#^.*/(fs/overlayfs/|include/)#\1#' \
			-e 's/^([^:]+):[0-9]+(:[0-9]+)?:/\1:/' |
		sort
}

# new_warnings BASE NOW: the lines of NOW that BASE lacks (as a multiset).
new_warnings() {
	comm -13 <(sort "$1") <(sort "$2")
}

# sync_tree: make the bisect tree pristine again, giving every file rsync
# rewrote a fresh mtime so make rebuilds what a patch touched last time.
sync_tree() {
	mkdir -p "$SRC" "$LOGS"
	# Logs of patches that left the series would read as current.
	rm -f "$LOGS"/*
	rm -rf "$SRC/.pc"
	rsync -a --delete --exclude=/.pc --out-format='%n' "$STOCK_SRC/" "$SRC/" |
		(cd "$SRC" && grep -v '/$' | xargs -r -d '\n' touch --no-create --) || true
}

# build_overlayfs OBJ LOG: W=1 and sparse build of fs/overlayfs from scratch
# (its objects are removed first so every file is compiled and checked;
# ccache makes the unchanged ones free).
build_overlayfs() {
	local obj=$1 log=$2
	find "$obj/fs/overlayfs" -name '*.o' -delete 2>/dev/null || true
	make -C "$SRC" O="$obj" ARCH=x86_64 -j"$JOBS" CC="ccache gcc" \
		W=1 C=2 CHECK="sparse" fs/overlayfs/ >"$log" 2>&1
}

# module_build: fs/overlayfs/overlay.ko with CONFIG_OVERLAY_FS=m in an
# object dir of its own, from the configuration of the bisect tree.  Its
# objects are removed first so the compiler warnings are all in the log.
module_build() {
	local obj=$ROOT/$TREE/obj-module log=$LOGS/module.log
	mkdir -p "$obj"
	if ! cmp -s "$OBJ/.config" "$obj/.config.base" 2>/dev/null; then
		cp "$OBJ/.config" "$obj/.config.base"
		cp "$OBJ/.config" "$obj/.config"
		"$SRC/scripts/config" --file "$obj/.config" --enable MODULES --module OVERLAY_FS
		make -C "$SRC" O="$obj" ARCH=x86_64 olddefconfig >"$log" 2>&1 || return 1
		grep -qx 'CONFIG_OVERLAY_FS=m' "$obj/.config" || {
			echo "CONFIG_OVERLAY_FS=m did not survive olddefconfig" >>"$log"
			return 1
		}
	fi
	find "$obj/fs/overlayfs" \( -name '*.o' -o -name '*.ko' \) -delete 2>/dev/null || true
	# No vmlinux is built here, so modpost (which newer kernels run for a
	# single .ko) cannot resolve the kernel's symbols: it is told to warn,
	# and every symbol it reports undefined must be exported somewhere in
	# the source, or the module would not load.
	make -C "$SRC" O="$obj" ARCH=x86_64 -j"$JOBS" CC="ccache gcc" \
		modules_prepare >>"$log" 2>&1 &&
		make -C "$SRC" O="$obj" ARCH=x86_64 -j"$JOBS" CC="ccache gcc" \
			KBUILD_MODPOST_WARN=1 W=1 fs/overlayfs/overlay.ko >>"$log" 2>&1 &&
		[ -f "$obj/fs/overlayfs/overlay.ko" ] &&
		module_symbols_exported "$log"
}

# module_symbols_exported LOG: the symbols modpost left undefined in LOG
# are all exported by the source tree (EXPORT_SYMBOL and its variants).
module_symbols_exported() {
	local log=$1 undef missing
	undef=$(grep -oE '"[^"]+" \[fs/overlayfs/overlay.ko\] undefined' "$log" | cut -d'"' -f2 | sort -u)
	[ -n "$undef" ] || return 0
	missing=$(comm -23 <(echo "$undef") <(
		grep -rhoE --include='*.c' --include='*.S' --include='*.h' \
			'EXPORT_SYMBOL(_GPL)?(_NS)?(_GPL)?\(\s*[A-Za-z_0-9]+' "$SRC" |
			sed -E 's/.*\(\s*//' | sort -u))
	[ -z "$missing" ] && return 0
	echo "overlay.ko uses symbols no EXPORT_SYMBOL in the tree provides: $(tr '\n' ' ' <<<"$missing")" >>"$log"
	return 1
}

row() {
	printf '%-56s | %-16s | %-10s | %-6s | %-8s | %-8s\n' "$@"
}

main() {
	command -v sparse >/dev/null || die "sparse is not installed (run scripts/deps.sh)"
	command -v quilt >/dev/null || die "quilt is not installed (run scripts/deps.sh)"
	[ -f "$SERIES_DIR/series" ] || die "$SERIES_DIR/series not found"

	mkdir -p "$ROOT"
	exec 9>"$ROOT/$TREE.lock"
	if ! flock -n 9; then
		say "waiting for another series check to finish with $ROOT/$TREE"
		flock 9
	fi

	"$OVLKIT_TOP/scripts/kernel.sh" source
	say "syncing the $TREE tree from pristine"
	sync_tree
	"$OVLKIT_TOP/scripts/kernel.sh" config "$TREE"
	OBJ=$("$OVLKIT_TOP/scripts/kernel.sh" path "$TREE")
	OBJ=${OBJ%/arch/x86/boot/bzImage}
	[ -f "$OBJ/.config" ] || die "no configuration in $OBJ"

	# The baseline: what stock fs/overlayfs already warns about.
	local base=$LOGS/stock.warnings
	phase "stock fs/overlayfs (W=1, sparse)" "$LOGS/stock.log" build_overlayfs "$OBJ" "$LOGS/stock.build"
	warnings "$LOGS/stock.build" >"$base"
	say "stock baseline: $(wc -l <"$base") W=1/sparse diagnostics"

	local patches=() p
	mapfile -t patches < <(series_patches)
	[ "${#patches[@]}" -gt 0 ] || die "the series is empty"

	echo
	row patch checkpatch meta build W=1 sparse
	row "$(printf '%.0s-' {1..56})" ---------------- ---------- ------ -------- --------
	local applied=0
	for p in "${patches[@]}"; do
		local name=${p%.patch} style meta build w1 sp log now newl
		style=$(check_style "$SERIES_DIR/$p") || problems=$((problems + 1))
		meta=$(check_meta "$SERIES_DIR/$p" "$((applied + 1))" "${#patches[@]}") ||
			problems=$((problems + 1))
		if ! (cd "$SRC" && QUILT_PATCHES=$SERIES_DIR quilt --quiltrc=- push --fuzz=0 "$p") \
			>"$LOGS/$name.quilt" 2>&1; then
			row "$name" "$style" "$meta" "no apply" - -
			problems=$((problems + 1))
			echo "  $p does not apply (fuzz 0) after the patches before it; see $LOGS/$name.quilt" >&2
			break
		fi
		applied=$((applied + 1))
		log=$LOGS/$name.build
		if build_overlayfs "$OBJ" "$log"; then
			build=ok
		else
			build=FAIL
			problems=$((problems + 1))
		fi
		now=$LOGS/$name.warnings
		warnings "$log" >"$now"
		newl=$(new_warnings "$base" "$now")
		w1=ok
		sp=ok
		# gcc names the flag of every warning ([-Wfoo]); sparse does not.
		if grep -q '\[-W' <<<"$newl"; then
			w1="$(grep -c '\[-W' <<<"$newl") new"
			problems=$((problems + 1))
		fi
		if grep -v '\[-W' <<<"$newl" | grep -q .; then
			sp="$(grep -v '\[-W' <<<"$newl" | grep -c .) new"
			problems=$((problems + 1))
		fi
		row "$name" "$style" "$meta" "$build" "$w1" "$sp"
		if [ -n "$newl" ]; then
			# shellcheck disable=SC2001 # indents every line
			sed 's/^/    /' <<<"$newl"
		fi
	done
	echo

	if [ "$applied" -eq "${#patches[@]}" ]; then
		if module_build; then
			# Compiler warnings only: the baseline's sparse ones do
			# not apply, sparse does not run on this build.
			local modnew
			modnew=$(new_warnings <(grep '\[-W' "$base") <(warnings "$LOGS/module.log" | grep '\[-W'))
			if [ -n "$modnew" ]; then
				echo "CONFIG_OVERLAY_FS=m: overlay.ko builds, with $(grep -c . <<<"$modnew") new W=1 warning(s):"
				# shellcheck disable=SC2001 # indents every line
				sed 's/^/    /' <<<"$modnew"
				problems=$((problems + 1))
			else
				echo "CONFIG_OVERLAY_FS=m: fs/overlayfs/overlay.ko builds with the whole series, no new W=1 warning"
			fi
		else
			echo "CONFIG_OVERLAY_FS=m: FAIL (see $LOGS/module.log)"
			grep -E 'error:|Error [0-9]|\*\*\*|uses symbols' "$LOGS/module.log" | head -n 20 || true
			problems=$((problems + 1))
		fi
	else
		echo "CONFIG_OVERLAY_FS=m: not tried, the series does not apply"
	fi

	local cover=$SERIES_DIR/0000-cover-letter.patch unnamed=0 s
	if [ -f "$cover" ]; then
		for p in "${patches[@]}"; do
			s=$(patch_subject "$SERIES_DIR/$p")
			if ! tr -s ' \n' ' ' <"$cover" | grep -qF "$s"; then
				echo "cover letter does not name $p (\"$s\")"
				unnamed=$((unnamed + 1))
			fi
		done
		[ "$unnamed" -eq 0 ] && echo "cover letter: names all ${#patches[@]} patches"
		problems=$((problems + unnamed))
	else
		echo "cover letter: $cover is missing"
		problems=$((problems + 1))
	fi

	for p in "${patches[@]}"; do
		local log=$LOGS/${p%.patch}.checkpatch
		if grep -q ':[0-9]*: \(ERROR\|WARNING\|CHECK\):' "$log" 2>/dev/null; then
			echo
			echo "checkpatch, $p:"
			sed 's/^/    /' "$log"
		fi
	done

	echo
	if [ "$problems" -gt 0 ]; then
		echo "series-check: $problems problem(s)"
		exit 1
	fi
	echo "series-check: clean (${#patches[@]} patches)"
}

main "$@"
