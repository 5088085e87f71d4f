# shellcheck shell=bash
# Shared by the Debian guest's scripts (xfstests_guest.sh,
# readers_guest.sh): vm.RunXfstests writes it to the control disk as
# /ovlkit/lib.sh next to run.sh.

# disk SERIAL prints the virtio disk whose serial is SERIAL: the host
# names disks by serial, not by probe order.
disk() {
	local s
	for s in /sys/block/vd*/serial; do
		if [ "$(cat "$s" 2>/dev/null)" = "$1" ]; then
			echo "/dev/$(basename "$(dirname "$s")")"
			return 0
		fi
	done
	return 1
}
