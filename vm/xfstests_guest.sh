#!/bin/bash
# Runs in the xfstests guest as /ovlkit/run.sh, started by the image's
# init (scripts/xfstests-image.sh) from the control disk that
# vm.RunXfstests writes. /ovlkit/env sets FSTYP (the base filesystem of
# the test and scratch disks) and CHECK_ARGS (groups or tests for
# ./check). Results go back on the control disk under /ovlkit/results.
set -u
# shellcheck source=/dev/null # written by the host for each run
. /ovlkit/env
# shellcheck source=guest_lib.sh
. /ovlkit/lib.sh

say() { echo "ovlkit-xfstests: $*"; }

test_dev=$(disk ovlkit-xfstest) || { say "no test disk"; exit 1; }
scratch_dev=$(disk ovlkit-xfscratch) || { say "no scratch disk"; exit 1; }
say "kernel $(uname -r), xfstests $(cat /opt/xfstests/COMMIT), base $FSTYP: test $test_dev scratch $scratch_dev"
mkdir -p /mnt/test /mnt/scratch

# README.overlay: the base filesystems are formatted beforehand (the host
# made them) and ./check -overlay mounts overlays on top of them.
cat >/opt/xfstests/local.config <<EOF
export FSTYP=$FSTYP
export TEST_DEV=$test_dev
export TEST_DIR=/mnt/test
export SCRATCH_DEV=$scratch_dev
export SCRATCH_MNT=/mnt/scratch
EOF
# overlay/100 to 117 drive unionmount-testsuite when the image has it.
if [ -x /opt/unionmount-testsuite/run ]; then
	echo "export UNIONMOUNT_TESTSUITE=/opt/unionmount-testsuite" >>/opt/xfstests/local.config
	say "unionmount-testsuite $(cat /opt/unionmount-testsuite/COMMIT)"
fi

# Kernel messages stay in the log (copied back as dmesg.txt, and check
# reads it after each test) but off the console, where they would land in
# the middle of check's per-test lines; a panic still shows.
dmesg -n 1

# check runs each test in a systemd scope when "systemd-run --scope"
# works, and stops the scope after the test to kill what it left running
# (overlay/058's open_by_handle, which otherwise keeps the scratch mount
# busy for every later test). The guest has no systemd: scope.sh makes a
# scope of a session. The root is a snapshot, so this lasts one boot.
if ! install -m 0755 /ovlkit/scope.sh /usr/local/bin/systemd-run ||
	! ln -sf systemd-run /usr/local/bin/systemctl ||
	! ln -sf systemd-run /usr/local/bin/systemd-escape; then
	say "cannot install scope.sh as systemd-run, systemctl and systemd-escape"
	exit 1
fi

cd /opt/xfstests || exit 1
rm -rf results
start=$(date +%s)
say "./check -overlay -R xunit $CHECK_ARGS"
# shellcheck disable=SC2086 # CHECK_ARGS is a list of words on purpose
./check -overlay -R xunit $CHECK_ARGS
rc=$?
say "check exited $rc after $(($(date +%s) - start))s"

mkdir -p /ovlkit/results
cp -a results/. /ovlkit/results/ 2>/dev/null
dmesg >/ovlkit/results/dmesg.txt
echo "$rc" >/ovlkit/results/check.rc
sync
say "done"
