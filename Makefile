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
	guest-test selftest series-check lint bench-pipeline clean

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

test: deps lint host-test kernel guest-test selftest series-check
	@echo "make test: all checks passed"

lint:
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || { echo "gofmt: files above need formatting" >&2; exit 1; }
	go vet ./...
	go vet -tags ovlkit_guest ./tests/guest/... ./cmd/ovlgraph
	go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 -tags ovlkit_guest ./tests/guest/... ./cmd/ovlgraph

host-test:
	@mkdir -p $(OUT)
	set -o pipefail; go test -json -count=1 ./... | $(OVLVM) junit -label host -o $(OUT)/junit-host.xml

guest-test:
	@mkdir -p $(OUT)
	$(OVLVM) test $(GUEST_FLAGS) -junit $(OUT)/junit-guest.xml -json $(OUT)/guest.json

selftest: kernel-patched
	@mkdir -p $(OUT)
	$(OVLVM) selftest -kernel patched -junit $(OUT)/junit-selftest.xml

series-check: deps
	@scripts/series-check.sh

bench-pipeline: deps
	@scripts/bench-pipeline.sh

clean:
	rm -rf $(OUT)
