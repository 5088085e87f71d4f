# ovlkit: overlayfs series, graph driver and the VM harness that proves them.
#
#   make          install what is missing, apply the series, build the
#                 patched kernel, boot it and run the guest suite
#   make test     host tests, then the guest suite on the patched and the
#                 stock kernel (proof tests must fail on stock), the
#                 harness self-test, and the series checks
#   make help     every target and option
#
# "make help" prints the "## " comments of this file: one after a target's
# prerequisites describes the target, one of the form "## NAME=default: what"
# above a variable describes an option. README.md's option table lists the
# same options; make lint fails when the two differ.

SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
## CACHE=$XDG_CACHE_HOME/ovlkit: kernel trees, build directories, ccache, initramfs, run logs
export CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ovlkit
## ACCEL=auto: kvm, tcg, or auto (KVM only if a probe boot reaches the kernel banner)
export ACCEL ?= auto
# The one place the kernel base is chosen; scripts, ovlvm and the kconfig
# fragments read it from the environment.
## KBASE=6.1: kernel base: linux-source-$KBASE, patches/$KBASE (6.1 or 6.12)
export KBASE ?= 6.1
## KCONFIG_EXTRA=: extra fragments from kconfig/, e.g. debug
export KCONFIG_EXTRA
## KERNEL=patched: kernel for make: patched, stock, or a devtree name
KERNEL ?= patched
## RUN=: regexp of guest tests to run (default all)
RUN ?=
## FS=ext4,xfs,btrfs,xfs-ftype0,vfat: disk filesystems to attach (tmpfs is always there)
FS ?= ext4,xfs,btrfs,xfs-ftype0,vfat
## V=1: show the full kernel build output
OUT := build
GUEST_FLAGS = -fs $(FS) $(if $(RUN),-run '$(RUN)')
OVLVM = go run ./cmd/ovlvm

.PHONY: all deps kernel kernel-stock kernel-patched run test host-test \
	guest-test selftest series-check lint bench-pipeline clean fuzz fuzz-short \
	test-debug help

all: deps kernel-$(KERNEL) ## install what is missing, build KERNEL, boot it, run the guest suite
	@mkdir -p $(OUT)
	$(OVLVM) run -kernel $(KERNEL) $(GUEST_FLAGS) -junit $(OUT)/junit-guest.xml -json $(OUT)/guest.json

deps: ## install the Debian packages that are missing
	@scripts/deps.sh

kernel: kernel-stock kernel-patched ## build the stock and the patched kernel

kernel-stock: deps ## build the stock kernel
	@scripts/kernel.sh build stock

kernel-patched: deps ## build the patched kernel
	@scripts/kernel.sh build patched

# Any other tree made with "scripts/kernel.sh devtree NAME".
kernel-%: deps ## build a tree made by scripts/kernel.sh devtree NAME
	@scripts/kernel.sh build $*

test: deps lint host-test fuzz-short kernel guest-test snapshotter-short crash-short crash-replay-short selftest bench-check series-check test-other-bases ## every check: lint, host tests, fuzz-short, both kernels, guest suite, containerd's snapshotter suite, hard cuts, a short power-cut replay, selftest, bench-check, series; other bases' kernels, suite and series
	@echo "make test: all checks passed"

# make test covers KBASE fully and every other kernel base with its two
# kernels, the guest suite and the series checks (Documentation/ci.rst);
# each base's reports go to build/BASE/.
## TEST_OTHER_BASES=6.12: the bases make test also builds, boots and series-checks
TEST_OTHER_BASES ?= $(filter-out $(KBASE),6.1 6.12)
.PHONY: test-other-bases
test-other-bases: ## the other bases' kernels, guest suite and series checks (part of make test)
	@set -e; for b in $(TEST_OTHER_BASES); do \
		echo "make test: kernel base $$b"; \
		$(MAKE) --no-print-directory KBASE=$$b OUT=$(OUT)/$$b kernel guest-test series-check; \
	done

# actionlint runs shellcheck over the workflow's run: scripts too.
ACTIONLINT = go run github.com/rhysd/actionlint/cmd/actionlint@v1.7.12
lint: ## gofmt, go vet, staticcheck, shellcheck, actionlint, README's option table
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || { echo "gofmt: files above need formatting" >&2; exit 1; }
	go vet ./...
	go vet -tags ovlkit_guest ./tests/guest/... ./cmd/ovlgraph
	go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 -tags ovlkit_guest ./tests/guest/... ./cmd/ovlgraph
	cd bench && go vet ./... && go vet -tags ovlkit_guest ./... \
		&& go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./... \
		&& go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 -tags ovlkit_guest ./...
	@command -v shellcheck >/dev/null || { echo "lint: shellcheck is missing (make deps installs it)" >&2; exit 1; }
	shellcheck -x -P SCRIPTDIR scripts/*.sh .ci/run
	$(ACTIONLINT) .github/workflows/*.yml
	@diff <(sed -n 's/^## \([A-Z_]*\)=.*/\1/p' Makefile | sort) \
		<(sed -n 's/^| `\([A-Z_]*\)=.*/\1/p' README.md | sort) \
		|| { echo "lint: the options of README.md's table (>) and the Makefile's ## comments (<) differ" >&2; exit 1; }

# The benchmark module (bench/, its own go.mod) has host tests too: the
# experiments' statistics, tables and plots.
host-test: ## go test ./... on the host, in the main and the benchmark module
	@mkdir -p $(OUT)
	set -o pipefail; { go test -json -count=1 ./... && (cd bench && go test -json -count=1 ./...); } \
		| $(OVLVM) junit -label host -o $(OUT)/junit-host.xml

# Every Fuzz target of the repository, one after the other, for FUZZTIME
# each (fuzz) or FUZZTIME_SHORT each (fuzz-short, part of make test), by
# scripts/fuzz.sh. The targets make and remove thousands of small trees,
# so they run in a temporary directory on tmpfs where there is one: on a
# disk filesystem a busy journal stalls every removal.
## FUZZTIME=2m: time per fuzz target in make fuzz
FUZZTIME ?= 2m
## FUZZTIME_SHORT=10s: time per fuzz target in make fuzz-short
FUZZTIME_SHORT ?= 10s
## FUZZ_TMPDIR=/dev/shm: where the fuzz targets make their trees (tmpfs when there is one)
FUZZ_TMPDIR ?= $(if $(wildcard /dev/shm/.),/dev/shm,$(or $(TMPDIR),/tmp))

fuzz: ## every fuzz target for FUZZTIME each
	FUZZ_TMPDIR=$(FUZZ_TMPDIR) scripts/fuzz.sh $(FUZZTIME)

fuzz-short: ## every fuzz target for FUZZTIME_SHORT each
	FUZZ_TMPDIR=$(FUZZ_TMPDIR) scripts/fuzz.sh $(FUZZTIME_SHORT)

guest-test: ## ovlvm test: the guest suite on both kernels, proofs and keeps judged
	@mkdir -p $(OUT)
	$(OVLVM) test $(GUEST_FLAGS) -junit $(OUT)/junit-guest.xml -json $(OUT)/guest.json

# The store as a containerd snapshotter (snapshotter/ and its guest tests
# in tests/guest/snapshotter: modules of their own, which ./... and
# ./tests/guest/... leave out): vet, staticcheck and host tests of both,
# then containerd's own snapshotter suite on tmpfs, ext4, xfs and btrfs
# on both kernels. See Documentation/snapshotter.rst and testing.rst.
SNAPSHOTTER_LINT = GOWORK=$$PWD/go.work go vet -tags ovlkit_guest ./... \
	&& GOWORK=$$PWD/go.work go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 -tags ovlkit_guest ./...
.PHONY: snapshotter-test
snapshotter-test: deps kernel ## the containerd snapshotter: its host tests, then containerd's suite in the guest on both kernels
	@mkdir -p $(OUT)
	cd snapshotter && $(SNAPSHOTTER_LINT) && GOWORK=$$PWD/go.work go test -count=1 ./...
	cd tests/guest/snapshotter && $(SNAPSHOTTER_LINT)
	$(OVLVM) test -pkg ./tests/guest/snapshotter -fs ext4,xfs,btrfs -mem 1024 \
		-junit $(OUT)/junit-snapshotter.xml -json $(OUT)/guest-snapshotter.json

# make test's part of it: the module's host tests, then containerd's suite
# in process on tmpfs and ext4, the two proofs, and a real containerd and
# ctr over ovlsnapd's socket, on both kernels (the whole of
# snapshotter-test took six minutes of guest time under TCG).
.PHONY: snapshotter-short
snapshotter-short: deps kernel ## containerd's snapshotter suite on tmpfs and ext4, and a real containerd and ctr over ovlsnapd, both kernels (part of make test)
	@mkdir -p $(OUT)
	cd snapshotter && GOWORK=$$PWD/go.work go test -count=1 ./...
	$(OVLVM) test -pkg ./tests/guest/snapshotter -fs ext4 -mem 1024 \
		-run 'TestContainerdSuite$$|TestStrictUpperOption|TestFsyncStrictOption|TestContainerdDaemon' \
		-junit $(OUT)/junit-snapshotter.xml -json $(OUT)/guest-snapshotter.json

# ctr run in the guest: kernels built with kconfig/containers.config
# (namespaces, cgroup v2, devpts, ...; build directories of their own), a
# static runc (scripts/runc.sh, the version tools/runc/go.mod pins),
# containerd's runc shim (the tool of the test's module: the containerd the
# test runs) and the static program the test's image carries put into the
# guest with -file,
# then TestContainerdRun on both kernels, where it must run, not skip. Not
# part of make test: two more kernel builds. See Documentation/snapshotter.rst.
.PHONY: containerd-run
containerd-run: deps ## ctr run of a static program from an image ovlsnapd unpacked, on kernels with namespaces and cgroups (not part of make test)
	@mkdir -p $(OUT) $(CACHE)/bin
	@set -e; for tree in stock patched; do \
		start=$$(date +%s); \
		KCONFIG_EXTRA=containers scripts/kernel.sh build $$tree; \
		echo "containerd-run: $$tree containers kernel built in $$(( $$(date +%s) - start ))s"; \
	done
	cd tests/guest/snapshotter && CGO_ENABLED=0 GOWORK=$$PWD/go.work \
		go build -trimpath -ldflags '-s -w' -o $(CACHE)/bin/ovlkit-inimage ./inimage
	cd tests/guest/snapshotter && CGO_ENABLED=0 GOWORK=$$PWD/go.work \
		go build -trimpath -ldflags '-s -w' -o $(CACHE)/bin/containerd-shim-runc-v2 \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
	@set -e; runc=$$(scripts/runc.sh); \
	start=$$(date +%s); \
	$(OVLVM) test -stock "$$(KCONFIG_EXTRA=containers scripts/kernel.sh path stock)" \
		-patched "$$(KCONFIG_EXTRA=containers scripts/kernel.sh path patched)" \
		-pkg ./tests/guest/snapshotter -run 'TestContainerdRun$$' -fs ext4 -mem 1024 \
		-env OVLKIT_CONTAINERS=required \
		-file "$$runc=/usr/local/bin/runc" \
		-file $(CACHE)/bin/containerd-shim-runc-v2=/usr/local/bin/containerd-shim-runc-v2 \
		-file $(CACHE)/bin/ovlkit-inimage=/usr/local/bin/ovlkit-inimage \
		-junit $(OUT)/junit-containerd-run.xml -json $(OUT)/guest-containerd-run.json; \
	echo "containerd-run: guest runs took $$(( $$(date +%s) - start ))s"

# The debug run: stock and patched built with kconfig/debug.config (KASAN,
# UBSAN, lockdep, KFENCE, DEBUG_OBJECTS, failslab; build directories of
# their own), kconfigcheck listing every debug symbol that survived, then
# the whole guest suite plus the fault-injection tests of tests/guest/faults
# (a module of its own: only this target runs it) on every filesystem.
# Any kernel report fails the run, and so does lockdep found off at the
# end. Too slow for make test under TCG; see Documentation/testing.rst.
## DEBUG_TIMEOUT=300m: make test-debug's timeout per VM and per test binary
DEBUG_TIMEOUT ?= 300m
## DEBUG_MEM=2048: make test-debug's guest memory in MiB
DEBUG_MEM ?= 2048
test-debug: deps ## both kernels with kconfig/debug.config, the whole suite plus the fault injection
	@mkdir -p $(OUT)
	cd tests/guest/faults && GOWORK=$$PWD/go.work go vet -tags ovlkit_guest .
	@set -e; for tree in stock patched; do \
		start=$$(date +%s); \
		KCONFIG_EXTRA=debug scripts/kernel.sh build $$tree; \
		echo "test-debug: $$tree debug kernel built in $$(( $$(date +%s) - start ))s"; \
		img=$$(KCONFIG_EXTRA=debug scripts/kernel.sh path $$tree); \
		go run ./tools/kconfigcheck -v -config $${img%/arch/x86/boot/bzImage}/.config kconfig/debug.config \
			$$(ls kconfig/debug-$(KBASE).config 2>/dev/null); \
	done
	@start=$$(date +%s); \
	$(OVLVM) test -stock "$$(KCONFIG_EXTRA=debug scripts/kernel.sh path stock)" \
		-patched "$$(KCONFIG_EXTRA=debug scripts/kernel.sh path patched)" \
		-pkg ./tests/guest/... -pkg ./cmd/ovlgraph -pkg ./tests/guest/faults \
		-env OVLKIT_LOCKDEP=required -mem $(DEBUG_MEM) \
		-timeout $(DEBUG_TIMEOUT) -test-timeout $(DEBUG_TIMEOUT) $(GUEST_FLAGS) \
		-junit $(OUT)/junit-debug.xml -json $(OUT)/guest-debug.json; \
	rc=$$?; echo "test-debug: guest suite on both debug kernels took $$(( $$(date +%s) - start ))s"; exit $$rc

# The power-cut replay (tests/guest/crash, a module of its own that only
# this target runs): on the ordinary stock and patched kernels
# (kconfig/guest.config has dm-log-writes), kconfigcheck listing the
# device-mapper symbols, then on ext4 and xfs the copy-up workload
# (fsync=auto and fsync=strict, metacopy off and on) and the layer store's
# workload (auto and strict), each log replayed to every mark and to
# CRASH_POINTS points in all (every mark, then flushes, FUA writes and
# points between them, evenly spread), and checked. Prints one table row
# per kernel, filesystem and mode ("crash-row:", "crash-store-row:");
# RUN= picks subtests, e.g. RUN='^TestStoreCrash$/^xfs$'. About twenty
# minutes in the guests under TCG: not part of make test, which runs
# crash-replay-short; see Documentation/testing.rst.
## CRASH_POINTS=100: make crash-test's replay points per run, every mark among them
CRASH_POINTS ?= 100
# The table rows in a crash run's go test -json events, each after the
# kernel (stock, patched) that printed it: both have the same release.
CRASH_ROWS = sed -n 's/.*"Package":"\([a-z]*\):.*\(crash-\(store-\)\{0,1\}row: [^"\\]*\).*/\1 \2/p'
.PHONY: crash-test
crash-test: deps kernel ## power-cut replay (dm-log-writes) of copy-up and of the layer store on ext4 and xfs, both kernels
	@mkdir -p $(OUT)
	cd tests/guest/crash && GOWORK=$$PWD/go.work go vet -tags ovlkit_guest . \
		&& GOWORK=$$PWD/go.work go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 -tags ovlkit_guest .
	@set -e; for tree in stock patched; do \
		img=$$(scripts/kernel.sh path $$tree); \
		grep -E '^CONFIG_(MD|BLK_DEV_DM|DM_LOG_WRITES)=' kconfig/guest.config > $(OUT)/crash-symbols.config; \
		go run ./tools/kconfigcheck -v -config $${img%/arch/x86/boot/bzImage}/.config $(OUT)/crash-symbols.config; \
	done
	@start=$$(date +%s); \
	$(OVLVM) test -pkg ./tests/guest/crash -fs ext4,xfs -mem 1536 -env OVLKIT_CRASH_POINTS=$(CRASH_POINTS) \
		-timeout 120m -test-timeout 110m $(if $(RUN),-run '$(value RUN)') \
		-junit $(OUT)/junit-crash.xml -json $(OUT)/guest-crash.json; \
	rc=$$?; $(CRASH_ROWS) $(OUT)/guest-crash.json | sort -u; \
	echo "crash-test: replay on both kernels took $$(( $$(date +%s) - start ))s"; exit $$rc

# make test's part of it: on both kernels, on ext4 and xfs, copy up
# (metacopy off) and the layer store, each with fsync=auto and
# fsync=strict, each log replayed to 12 points in all, its marks among
# them (the store's log has more marks than that: all of them, and no
# other point). Points are spread evenly, none picked at random.
.PHONY: crash-replay-short
crash-replay-short: deps kernel ## a short power-cut replay: copy-up and the store on ext4 and xfs, few points, both kernels (part of make test)
	@mkdir -p $(OUT)
	cd tests/guest/crash && GOWORK=$$PWD/go.work go vet -tags ovlkit_guest .
	@start=$$(date +%s); \
	$(OVLVM) test -pkg ./tests/guest/crash -fs ext4,xfs -mem 1536 -env OVLKIT_CRASH_POINTS=12 \
		-run '^Test(CopyUp|Store)Crash$$/^(ext4|xfs)$$/^(auto|strict)$$' -timeout 20m -test-timeout 15m \
		-junit $(OUT)/junit-crash-short.xml -json $(OUT)/guest-crash-short.json; \
	rc=$$?; $(CRASH_ROWS) $(OUT)/guest-crash-short.json | sort -u; \
	echo "crash-replay-short: replay on both kernels took $$(( $$(date +%s) - start ))s"; exit $$rc

selftest: kernel-patched ## show that the harness catches what it must
	@mkdir -p $(OUT)
	$(OVLVM) selftest -kernel patched -junit $(OUT)/junit-selftest.xml

series-check: deps ## checkpatch, bisect build, W=1 and sparse over the series
	@scripts/series-check.sh

# xfstests' overlay tests (./check -overlay) in a Debian guest on the stock
# and the patched kernel; fails on any test that passes on stock and fails
# on patched (Documentation/regress.rst). Hours under TCG: not in make test.
# XFSTESTS= is the source (a path or git URL; upstream by default).
## REGRESS_GROUP=auto: xfstests group for make regress
REGRESS_GROUP ?= auto
## REGRESS_FS=ext4,xfs: base filesystems for make regress
REGRESS_FS ?= ext4,xfs
## REGRESS_BASELINE=all: what the stock kernel runs in make regress: all, or failures (only what patched did not pass)
REGRESS_BASELINE ?= all
## REGRESS_PART=: N/OF runs only the N-th of OF contiguous parts of REGRESS_GROUP (empty: all of it)
REGRESS_PART ?=
## XFSTESTS=upstream: xfstests-dev for make regress, a path or git URL
## XFSTESTS_REF=: the xfstests commit for make regress (default its head)
## UNIONMOUNT=upstream: unionmount-testsuite for make regress (overlay/100-117), a path, git URL or none
## UNIONMOUNT_REF=: the unionmount-testsuite commit for make regress (default its head)
export XFSTESTS XFSTESTS_REF UNIONMOUNT UNIONMOUNT_REF
.PHONY: regress
regress: deps kernel ## xfstests' overlay tests on both kernels in a Debian guest (hours under TCG)
	@mkdir -p $(OUT)
	@start=$$(date +%s); \
	$(OVLVM) xfstests -kernel stock,patched -g $(REGRESS_GROUP) -fs $(REGRESS_FS) -baseline $(REGRESS_BASELINE) \
		$(if $(REGRESS_PART),-part $(REGRESS_PART)) -junit $(OUT)/junit-xfstests.xml -table $(OUT)/xfstests.rst; \
	rc=$$?; echo "regress: xfstests -g $(REGRESS_GROUP)$(if $(REGRESS_PART), part $(REGRESS_PART)) on $(REGRESS_FS) took $$(( $$(date +%s) - start ))s"; exit $$rc

# The guest suite on Debian's own linux-image package of KBASE, unmodified,
# its modules loaded in the guest, judged as the stock kernel beside the
# patched build (Documentation/distro.rst).
.PHONY: distro-test
distro-test: deps kernel-patched ## guest suite on Debian's linux-image of KBASE, judged as stock against patched
	@mkdir -p $(OUT)
	$(OVLVM) test -stock distro $(GUEST_FLAGS) -junit $(OUT)/junit-distro.xml -json $(OUT)/guest-distro.json

# findmnt, dmesg and trace-cmd reading what the series prints, in the
# Debian guest (built without xfstests unless XFSTESTS is set) on both
# kernels. The Go readers (procfs, moby/sys/mountinfo, go-kmsg-parser) run
# in make test's guest suite.
.PHONY: readers
readers: deps kernel ## findmnt, dmesg and trace-cmd on the series' output, both kernels
	@mkdir -p $(OUT)
	$(OVLVM) readers -kernel stock,patched -junit $(OUT)/junit-readers.xml

# Hard cuts (vm/cuts.go; the guest side is tests/guest/cuts, a module of
# its own that only these targets run): the store workload on persistent
# ext4 and xfs disks, QEMU killed at a seeded random moment, and every next
# boot mounts the disks (journal replay), opens the store (its recovery),
# checks it against what was acknowledged, and e2fsck -n and xfs_repair -n
# check the images on the host. One boot per cut, both disks cut at once.
# About 12 s per cut under TCG; see Documentation/testing.rst.
## CUTS=100: make crash's cuts (each cuts ext4 and xfs at once)
CUTS ?= 100
## CUTS_SEED=: seed of make crash's first cut, cut i uses CUTS_SEED+i (default: picked and printed)
CUTS_SEED ?=
## CUTS_SHORT=3: the hard cuts make test makes, from seed 1
CUTS_SHORT ?= 3
.PHONY: crash crash-short
crash-short: deps kernel-patched ## CUTS_SHORT hard cuts from seed 1 (part of make test)
	cd tests/guest/cuts && GOWORK=$$PWD/go.work go vet -tags ovlkit_guest .
	$(OVLVM) cuts -kernel patched -count $(CUTS_SHORT) -seed 1

crash: deps kernel-patched ## hard cuts: the store on ext4 and xfs, QEMU killed CUTS times, each next boot checked
	cd tests/guest/cuts && GOWORK=$$PWD/go.work go vet -tags ovlkit_guest .
	@start=$$(date +%s); \
	$(OVLVM) cuts -kernel patched -count $(CUTS) $(if $(CUTS_SEED),-seed $(CUTS_SEED)); \
	rc=$$?; echo "crash: $(CUTS) cuts took $$(( $$(date +%s) - start ))s"; exit $$rc

# The store under load in the guest (tests/guest/stress): 64 goroutines
# and a second process on one store, a mount namespace holding a layer's
# mount as it is removed. make test's guest suite runs it with 1,000
# operations on ext4; this is the long run. KCONFIG_EXTRA=debug runs it on
# the debug kernel, with DEBUG_MEM and lockdep required as make test-debug.
## STRESS_OPS=10000: make stress's operations of the first process (the second does a quarter as many)
STRESS_OPS ?= 10000
## STRESS_FS=ext4,xfs: make stress's filesystems
STRESS_FS ?= ext4,xfs
.PHONY: stress
stress: deps kernel-patched ## the store under 64 goroutines, a second process and a mount namespace: STRESS_OPS operations
	@mkdir -p $(OUT)
	@start=$$(date +%s); \
	$(OVLVM) run -kernel patched -pkg ./tests/guest/stress -fs $(STRESS_FS) \
		$(if $(filter debug,$(KCONFIG_EXTRA)),-mem $(DEBUG_MEM) -env OVLKIT_LOCKDEP=required,-mem 1024) \
		-env OVLKIT_STRESS_OPS=$(STRESS_OPS) -env OVLKIT_STRESS_FS=$(STRESS_FS) \
		-timeout 180m -test-timeout 170m -json $(OUT)/guest-stress.json; \
	rc=$$?; grep -o 'stress-row: [^"\\]*' $(OUT)/guest-stress.json | sort -u; \
	echo "stress: $(STRESS_OPS) operations on $(STRESS_FS) took $$(( $$(date +%s) - start ))s"; exit $$rc

bench-pipeline: deps ## time the loop: builds, edit to result, boot to result
	@scripts/bench-pipeline.sh

# The article's claims measured (bench/experiments; see
# Documentation/benchmarks.rst): container create/destroy, page cache
# sharing, copy-up and the inodes of the hardlink layout, in one boot of
# the patched kernel with ext4, xfs and btrfs disks. bench/cmd/benchplot
# then prints a table per experiment and writes the tables, a PNG plot
# per experiment and the JSON results into Documentation/. About 14
# minutes under TCG: not part of make test, which runs bench-check instead.
BENCH_RUN = $(OVLVM) run -kernel patched -pkg ./bench/experiments -run '^$$' -bench . \
	-fs ext4,xfs,btrfs -mem 1536 -env OVLKIT_BENCHTIME=1x
.PHONY: bench bench-check
bench: deps kernel-patched ## the article's claims: create/destroy, page cache, copy-up, inodes; tables, plots, results
	@mkdir -p $(OUT)
	@set -o pipefail; start=$$(date +%s); \
	$(BENCH_RUN) -timeout 75m -test-timeout 70m -json $(abspath $(OUT))/bench.json 2>&1 | tee $(OUT)/bench.log; \
	rc=$$?; echo "bench: guest run took $$(( $$(date +%s) - start ))s"; exit $$rc
	@accel=$(ACCEL); if [ "$$accel" = auto ]; then \
		accel=$$(sed -n 's/^ovlvm: accelerator: \([a-z]*\).*/\1/p' $(OUT)/bench.log | head -n 1); fi; \
	cd bench && go run ./cmd/benchplot -in $(abspath $(OUT))/bench.json -accel "$$accel" \
		-out $(CURDIR)/Documentation -results $(CURDIR)/Documentation/benchmarks.json

# make bench shrunk (OVLKIT_EXP_QUICK: small sizes, two repetitions) to
# check the experiments and benchplot end to end in under a minute; its
# tables and plots go to $(OUT)/bench-check, never to Documentation/.
bench-check: kernel-patched ## make bench shrunk to a minute, output under build/ (part of make test)
	@mkdir -p $(OUT)/bench-check
	$(BENCH_RUN) -env OVLKIT_EXP_QUICK=1 -timeout 15m -test-timeout 10m -json $(abspath $(OUT))/bench-check.json
	cd bench && go run ./cmd/benchplot -in $(abspath $(OUT))/bench-check.json -out $(abspath $(OUT))/bench-check \
		-results $(abspath $(OUT))/bench-check/results.json

clean: ## remove build/
	rm -rf $(OUT)

# The targets, then the options, from the "## " comments above.
help: ## this list
	@echo 'usage: make [TARGET] [NAME=value ...]'
	@echo
	@echo 'Targets:'
	@sed -n 's/^\([a-zA-Z%_-]*\):.*## \(.*\)/  \1\t\2/p' $(firstword $(MAKEFILE_LIST)) | expand -t 22
	@echo
	@echo 'Options (NAME=default):'
	@sed -n 's/^## \([A-Z_]*=[^:]*\): \(.*\)/  \1\t\2/p' $(firstword $(MAKEFILE_LIST)) | expand -t 40
