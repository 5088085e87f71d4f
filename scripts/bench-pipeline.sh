#!/usr/bin/env bash
# Measure the pipeline: clean kernel build (no ccache, and with a warm
# ccache), one overlayfs file edited to a guest test result, and boot to
# result under the current accelerator. Prints medians of RUNS runs.
#
#   RUNS=3 BUILD_RUNS=1 scripts/bench-pipeline.sh
. "$(dirname "$0")/lib.sh"

RUNS=${RUNS:-3}
BUILD_RUNS=${BUILD_RUNS:-1}
ROOT=$(kernel_root)
kbuild_env
KS=$OVLKIT_TOP/scripts/kernel.sh
export PATH=/usr/local/go/bin:$PATH

"$KS" build stock >/dev/null
"$KS" build patched >/dev/null

declare -A samples

now() { date +%s.%N; }

# record NAME CMD...: run CMD once, add its wall time to NAME's samples.
record() {
	local name=$1 t0 t1
	shift
	t0=$(now)
	"$@" >>"$log" 2>&1 || die "$name: '$*' failed (see $log)"
	t1=$(now)
	samples[$name]+="$(echo "$t1 - $t0" | bc) "
	say "$name: $(echo "$t1 - $t0" | bc | xargs printf '%.1f')s"
}

log=$(mktemp)
bench_src=$ROOT/stock/src
bench_obj=$ROOT/stock/obj-bench

clean_build() {
	rm -rf "$bench_obj"
	mkdir -p "$bench_obj"
	(
		cd "$bench_src"
		ARCH=x86_64 KCONFIG_CONFIG="$bench_obj/.config" scripts/kconfig/merge_config.sh -n -O "$bench_obj" \
			"$OVLKIT_TOP/kconfig/guest.config" "$OVLKIT_TOP/kconfig/overlay.config" >/dev/null
		make -C "$bench_src" O="$bench_obj" ARCH=x86_64 -j"$(jobs)" CC="$1" bzImage
	)
}

for _ in $(seq "$BUILD_RUNS"); do
	CCACHE_DISABLE=1 record clean-build clean_build gcc
	record clean-build-warm-ccache clean_build "ccache gcc"
done
rm -rf "$bench_obj"

edit_to_result() {
	touch "$ROOT/patched/src/fs/overlayfs/super.c"
	"$KS" build patched &&
		go run ./cmd/ovlvm run -kernel patched -pkg ./tests/guest/semantics -run TestMountShowsLayers -fs ext4
}

boot_to_result() {
	go run ./cmd/ovlvm run -kernel patched -pkg ./tests/guest/harness -run TestGuestEnvironment -fs ""
}

cd "$OVLKIT_TOP"
go build -o /dev/null ./cmd/ovlvm
for _ in $(seq "$RUNS"); do
	record edit-to-result edit_to_result
	record boot-to-result boot_to_result
done

median() {
	tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {
		if (NR == 0) { print "-"; exit }
		m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
		printf "%.1f %.1f %.1f %d", m, a[1], a[NR], NR }'
}

printf '\n%-26s %5s %9s %9s %9s  %s\n' step runs median_s min_s max_s target
for name in clean-build clean-build-warm-ccache edit-to-result boot-to-result; do
	read -r med min max n <<<"$(echo "${samples[$name]:-}" | median)"
	case $name in
	clean-build) target="<= 240 s" ;;
	edit-to-result) target="<= 60 s" ;;
	boot-to-result) target="<= 10 s" ;;
	*) target="" ;;
	esac
	printf '%-26s %5s %9s %9s %9s  %s\n' "$name" "$n" "$med" "$min" "$max" "$target"
done
echo "accelerator: $(cat "$CACHE/accel" 2>/dev/null || echo 'see ovlvm output'); cpus: $(nproc); log: $log"
