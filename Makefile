# ovlkit: overlayfs series, graph driver and the VM harness that proves them.
#
#   make          install what is missing, apply the series, build the
#                 patched kernel, boot it and run the guest suite
#   make test     host tests, then the guest suite on the patched and the
#                 stock kernel (proof tests must fail on stock), the
#                 harness self-test, and the series checks
#
# Options: KBASE=6.1|6.12 (kernel base: linux-source-$(KBASE), patches/$(KBASE))
#          KERNEL=patched|stock|<tree>  ACCEL=auto|kvm|tcg  CACHE=<dir>
#          RUN=<regexp>  FS=ext4,xfs,btrfs,xfs-ftype0,vfat  KCONFIG_EXTRA=debug  V=1

SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
export CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ovlkit
export ACCEL ?= auto
# The one place the kernel base is chosen; scripts, ovlvm and the kconfig
# fragments read it from the environment.
export KBASE ?= 6.1
export KCONFIG_EXTRA
KERNEL ?= patched
RUN ?=
FS ?= ext4,xfs,btrfs,xfs-ftype0,vfat
OUT := build
GUEST_FLAGS = -fs $(FS) $(if $(RUN),-run '$(RUN)')
OVLVM = go run ./cmd/ovlvm

.PHONY: all deps kernel kernel-stock kernel-patched run test host-test \
	guest-test selftest series-check lint bench-pipeline clean fuzz fuzz-short \
	test-debug

all: deps kernel-$(KERNEL)
	@mkdir -p $(OUT)
	$(OVLVM) run -kernel $(KERNEL) $(GUEST_FLAGS) -junit $(OUT)/junit-guest.xml -json $(OUT)/guest.json

deps:
	@scripts/deps.sh

kernel: kernel-stock kernel-patched

kernel-stock: deps
	@scripts/kernel.sh build stock

kernel-patched: deps
	@scripts/kernel.sh build patched

# Any other tree made with "scripts/kernel.sh devtree NAME".
kernel-%: deps
	@scripts/kernel.sh build $*

test: deps lint host-test fuzz-short kernel guest-test selftest series-check
	@echo "make test: all checks passed"

# actionlint runs shellcheck over the workflow's run: scripts too.
ACTIONLINT = go run github.com/rhysd/actionlint/cmd/actionlint@v1.7.12
lint:
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || { echo "gofmt: files above need formatting" >&2; exit 1; }
	go vet ./...
	go vet -tags ovlkit_guest ./tests/guest/... ./cmd/ovlgraph
	go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 -tags ovlkit_guest ./tests/guest/... ./cmd/ovlgraph
	@command -v shellcheck >/dev/null || { echo "lint: shellcheck is missing (make deps installs it)" >&2; exit 1; }
	shellcheck -x -P SCRIPTDIR scripts/*.sh .ci/run
	$(ACTIONLINT) .github/workflows/*.yml

host-test:
	@mkdir -p $(OUT)
	set -o pipefail; go test -json -count=1 ./... | $(OVLVM) junit -label host -o $(OUT)/junit-host.xml

# Every Fuzz target of the repository, one after the other, for FUZZTIME
# each (fuzz) or FUZZTIME_SHORT each (fuzz-short, part of make test). The
# targets make and remove thousands of small trees, so they run in a
# temporary directory on tmpfs where there is one: on a disk filesystem a
# busy journal stalls every removal.
FUZZTIME ?= 2m
FUZZTIME_SHORT ?= 10s
FUZZ_TMPDIR ?= $(if $(wildcard /dev/shm/.),/dev/shm,$(or $(TMPDIR),/tmp))

define run-fuzz
	@set -e; \
	targets=$$(grep -ro --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*' . \
		| sed -n 's|^\./\(.*\)/[^/]*:func \(Fuzz.*\)|\1:\2|p' | sort -u); \
	total=$$(echo $$targets | wc -w); n=0; \
	tmp=$$(mktemp -d $(FUZZ_TMPDIR)/ovlkit-fuzz.XXXXXX); trap 'rm -rf "$$tmp"' EXIT; \
	for t in $$targets; do \
		n=$$((n + 1)); pkg=./$${t%%:*}; name=$${t#*:}; start=$$(date +%s); \
		echo "fuzz [$$n/$$total] $$pkg $$name for $(1)"; \
		TMPDIR=$$tmp go test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(1) $$pkg \
			|| { echo "fuzz: $$name failed; the failing input is under $$pkg/testdata/fuzz/$$name" >&2; exit 1; }; \
		echo "fuzz [$$n/$$total] $$name: passed in $$(( $$(date +%s) - start ))s"; \
	done
endef

fuzz:
	$(call run-fuzz,$(FUZZTIME))

fuzz-short:
	$(call run-fuzz,$(FUZZTIME_SHORT))

guest-test:
	@mkdir -p $(OUT)
	$(OVLVM) test $(GUEST_FLAGS) -junit $(OUT)/junit-guest.xml -json $(OUT)/guest.json

# The debug run: stock and patched built with kconfig/debug.config (KASAN,
# UBSAN, lockdep, KFENCE, DEBUG_OBJECTS, failslab; build directories of
# their own), kconfigcheck listing every debug symbol that survived, then
# the whole guest suite plus the fault-injection tests of tests/guest/faults
# (a module of its own: only this target runs it) on every filesystem.
# Any kernel report fails the run, and so does lockdep found off at the
# end. Too slow for make test under TCG; see Documentation/testing.rst.
DEBUG_TIMEOUT ?= 300m
DEBUG_MEM ?= 2048
test-debug: deps
	@mkdir -p $(OUT)
	cd tests/guest/faults && GOWORK=$$PWD/go.work go vet -tags ovlkit_guest .
	@set -e; for tree in stock patched; do \
		start=$$(date +%s); \
		KCONFIG_EXTRA=debug scripts/kernel.sh build $$tree; \
		echo "test-debug: $$tree debug kernel built in $$(( $$(date +%s) - start ))s"; \
		img=$$(KCONFIG_EXTRA=debug scripts/kernel.sh path $$tree); \
		go run ./tools/kconfigcheck -v -config $${img%/arch/x86/boot/bzImage}/.config kconfig/debug.config; \
	done
	@start=$$(date +%s); \
	$(OVLVM) test -stock "$$(KCONFIG_EXTRA=debug scripts/kernel.sh path stock)" \
		-patched "$$(KCONFIG_EXTRA=debug scripts/kernel.sh path patched)" \
		-pkg ./tests/guest/... -pkg ./cmd/ovlgraph -pkg ./tests/guest/faults \
		-env OVLKIT_LOCKDEP=required -mem $(DEBUG_MEM) \
		-timeout $(DEBUG_TIMEOUT) -test-timeout $(DEBUG_TIMEOUT) $(GUEST_FLAGS) \
		-junit $(OUT)/junit-debug.xml -json $(OUT)/guest-debug.json; \
	rc=$$?; echo "test-debug: guest suite on both debug kernels took $$(( $$(date +%s) - start ))s"; exit $$rc

selftest: kernel-patched
	@mkdir -p $(OUT)
	$(OVLVM) selftest -kernel patched -junit $(OUT)/junit-selftest.xml

series-check: deps
	@scripts/series-check.sh

# xfstests' overlay tests (./check -overlay) in a Debian guest on the stock
# and the patched kernel; fails on any test that passes on stock and fails
# on patched (Documentation/regress.rst). Hours under TCG: not in make test.
# XFSTESTS= is the source (a path or git URL; upstream by default).
REGRESS_GROUP ?= auto
REGRESS_FS ?= ext4,xfs
export XFSTESTS XFSTESTS_REF
.PHONY: regress
regress: deps kernel
	@mkdir -p $(OUT)
	@start=$$(date +%s); \
	$(OVLVM) xfstests -kernel stock,patched -g $(REGRESS_GROUP) -fs $(REGRESS_FS) \
		-junit $(OUT)/junit-xfstests.xml -table $(OUT)/xfstests.rst; \
	rc=$$?; echo "regress: xfstests -g $(REGRESS_GROUP) on $(REGRESS_FS) took $$(( $$(date +%s) - start ))s"; exit $$rc

bench-pipeline: deps
	@scripts/bench-pipeline.sh

clean:
	rm -rf $(OUT)
