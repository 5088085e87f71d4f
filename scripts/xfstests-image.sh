#!/bin/bash
# Build, once per Debian suite and xfstests commit, the root filesystem
# image of the xfstests guest: a minimal Debian with what xfstests needs
# to build and run, xfstests built inside it, and a small init that runs
# whatever the host puts on a control disk (ovlvm xfstests writes it).
# Prints the image's path on stdout; progress goes to stderr.
#
#   XFSTESTS=   xfstests source: a directory (work tree or bare git
#               repository) or a git URL; default: upstream xfstests-dev;
#               "none" for the Debian guest without xfstests
#   XFSTESTS_REF=  commit, tag or branch to build (default: its HEAD)
#   UNIONMOUNT= unionmount-testsuite, which overlay/100 to 117 run: a
#               directory or a git URL; default: upstream; "none" leaves
#               it out (those tests then report "not run")
#   UNIONMOUNT_REF=  its commit, tag or branch (default: its HEAD)
#   SUITE=      Debian suite (default: bookworm)
#   MIRROR=     Debian mirror (default: the one apt on this host uses)
#   CACHE=      cache directory; the image is
#               $CACHE/xfstests/SUITE-COMMIT/root.img
#
# Needs root (debootstrap, chroot), e2fsprogs and git; installs
# debootstrap when it is missing.
set -euo pipefail

UPSTREAM=git://git.kernel.org/pub/scm/fs/xfs/xfstests-dev.git
XFSTESTS=${XFSTESTS:-$UPSTREAM}
XFSTESTS_REF=${XFSTESTS_REF:-}
UNIONMOUNT_UPSTREAM=https://github.com/amir73il/unionmount-testsuite.git
UNIONMOUNT=${UNIONMOUNT:-$UNIONMOUNT_UPSTREAM}
UNIONMOUNT_REF=${UNIONMOUNT_REF:-}
SUITE=${SUITE:-bookworm}
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ovlkit}
IMAGE_SIZE=${IMAGE_SIZE:-6G}

say() { echo "xfstests-image: $*" >&2; }
die() { say "error: $*"; exit 1; }
phase_start=$SECONDS
phase() { say "$* ($((SECONDS - phase_start))s so far)"; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap and chroot)"
# Only this script needs debootstrap, so it installs it rather than
# scripts/deps.sh, which every make target runs.
if ! command -v debootstrap >/dev/null; then
	say "installing debootstrap"
	apt-get install -y -q debootstrap >/dev/null || die "apt-get install debootstrap failed"
fi
for t in debootstrap mkfs.ext4 debugfs git; do
	command -v "$t" >/dev/null || die "$t not found (apt-get install debootstrap e2fsprogs git)"
done

# What goes into the image besides minbase: the build and run
# dependencies from xfstests' README, less what this guest cannot use
# (lvm2 and dm tools: the guest kernel has device mapper, but xfstests'
# _require_dm_target wants SCRATCH_DEV to be a block device, and under
# -overlay it is the base's mount point, so no dm test runs; quota: no
# quota support; linux-headers: nothing is built against the kernel).
# trace-cmd, with util-linux's findmnt and dmesg, reads what the series
# prints as the programs people run do (ovlvm readers).
PACKAGES="acl attr automake autoconf bc e2fsprogs gawk gcc g++ make libc6-dev
libacl1-dev libaio-dev libcap-dev libgdbm-dev libgdbm-compat-dev libtool
libtool-bin liburing-dev libuuid1 uuid-dev uuid-runtime pkg-config psmisc
python3 sed xfsprogs xfslibs-dev btrfs-progs perl procps util-linux
libcap2-bin file xz-utils bsdextrautils kmod sqlite3 fio dbench
trace-cmd"

# PID 1 of the guest: mount the pseudo filesystems, then run the control
# disk's run.sh (serial ovlkit-control), which the host writes for each
# run, so the image itself never changes between runs. Ends the guest
# with a reboot, which QEMU's -no-reboot turns into an exit.
INIT=$(cat <<'EOF'
#!/bin/bash
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
# What udev would add to /dev: tests redirect to /dev/fd/N and
# /dev/stdout. The guest kernel has no Unix98 ptys, so devpts is
# optional and nothing else depends on it.
ln -sfn /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
mkdir -p /dev/pts /dev/shm
grep -qw devpts /proc/filesystems && mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
grep -qw tracefs /proc/filesystems && mount -t tracefs tracefs /sys/kernel/tracing
mount -o remount,rw /
hostname ovlkit-xfstests
ctl=""
for s in /sys/block/vd*/serial; do
	[ "$(cat "$s" 2>/dev/null)" = ovlkit-control ] && ctl=/dev/$(basename "$(dirname "$s")")
done
if [ -n "$ctl" ] && mkdir -p /ovlkit && mount "$ctl" /ovlkit && [ -x /ovlkit/run.sh ]; then
	/ovlkit/run.sh
	echo "ovlkit-xfstests: run.sh exited $?"
	umount /ovlkit
else
	echo "ovlkit-xfstests: no control disk with run.sh"
fi
sync
echo b >/proc/sysrq-trigger
sleep 10
EOF
)

# su for the guest, ahead of util-linux's in PATH. Made when the guest
# kernel had no networking: the audit netlink socket that Debian's libpam
# opens failed with ENOSYS, which libpam takes for a broken audit system,
# so every su ended in "System error" and xfstests reported each test
# that runs a command as fsgqa as not run. The kernel has CONFIG_NET now
# but no CONFIG_AUDIT, so the socket fails with EPROTONOSUPPORT, which
# libpam accepts as "no audit"; this su stays so that the image does not
# depend on which of the two errors a kernel gives. It makes the same
# switch of user, group list and environment through setpriv, which needs
# no PAM, and takes the options xfstests passes: -, -l, -s SHELL, -c
# COMMAND.
SU=$(cat <<'EOF'
#!/bin/bash
set -u
login=0 shell="" cmd="" user=""
while [ $# -gt 0 ]; do
	case $1 in
	-|-l|--login) login=1 ;;
	-s) shift; shell=${1-} ;;
	-s*) shell=${1#-s} ;;
	--shell=*) shell=${1#--shell=} ;;
	-c) shift; cmd=${1-} ;;
	--command=*) cmd=${1#--command=} ;;
	-m|-p|--preserve-environment) ;;
	--) shift; break ;;
	-*) echo "su: unsupported option $1" >&2; exit 1 ;;
	*) if [ -z "$user" ]; then user=$1; else break; fi ;;
	esac
	shift
done
user=${user:-root}
ent=$(getent passwd "$user") || { echo "su: user $user does not exist" >&2; exit 1; }
IFS=: read -r name _ uid gid _ home pwshell <<<"$ent"
shell=${shell:-${pwshell:-/bin/sh}}
env=(HOME="$home" SHELL="$shell" USER="$name" LOGNAME="$name" PATH="$PATH")
if [ "$login" = 1 ]; then
	env=(-i TERM="${TERM:-dumb}" "${env[@]}" PATH=/usr/local/bin:/usr/bin:/bin)
	cd "$home" 2>/dev/null || cd /
fi
args=()
[ -n "$cmd" ] && args=(-c "$cmd")
exec setpriv --reuid="$uid" --regid="$gid" --init-groups env "${env[@]}" "$shell" "${args[@]}" "$@"
EOF
)

mirror() {
	if [ -n "${MIRROR:-}" ]; then echo "$MIRROR"; return; fi
	local f
	# deb822 sources first: the URIs of the stanza that lists the suite.
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		awk -v s="$SUITE" '
			/^$/ { if (u != "" && hit) { print u; exit } u = ""; hit = 0; next }
			/^URIs:/ { u = $2 }
			/^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s) hit = 1 }
			END { if (u != "" && hit) print u }' "$f"
	done | head -n1 | grep . && return
	grep -hsE "^deb[[:space:]]+[^[:space:]]+[[:space:]]+${SUITE}[[:space:]]" /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
		awk '{print $2; exit}' | grep . && return
	echo http://deb.debian.org/debian
}

# The source, as a clone we can read the commit from.
work=$(mktemp -d "${TMPDIR:-/tmp}/xfstests-src.XXXXXX")
root=""
cleanup() {
	if [ -n "$root" ]; then
		umount -l "$root/proc" "$root/sys" "$root/dev/pts" "$root/dev" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

# fetch_source FROM REF DEST HINT: FROM (a plain directory, or a git
# repository or URL, checked out at REF if set) copied to DEST; prints its
# commit, or for a plain tree, which has none to record, a hash of its
# content. HINT says what to pass instead when a clone fails.
fetch_source() {
	local from=$1 ref=$2 dest=$3 hint=$4
	if [ -d "$from" ] && ! git -C "$from" rev-parse --git-dir >/dev/null 2>&1; then
		cp -a "$from" "$dest"
		echo "tree-$(cd "$dest" && find . -type f ! -path './.git/*' -print0 | sort -z |
			xargs -0 sha256sum | sha256sum | cut -c1-16)"
		return
	fi
	say "cloning $from"
	if ! git clone --quiet "$from" "$dest" 2>"$dest.clone-err"; then
		cat "$dest.clone-err" >&2
		die "cannot clone $from. Without network, pass a local copy: $hint"
	fi
	if [ -n "$ref" ]; then
		git -C "$dest" checkout --quiet "$ref" || die "no $ref in $from"
	fi
	git -C "$dest" rev-parse HEAD
}

src=$work/xfstests
commit=none
# XFSTESTS=none: the Debian guest alone, for checks that need its
# userland but not xfstests (ovlvm readers).
if [ "$XFSTESTS" != none ]; then
	commit=$(fetch_source "$XFSTESTS" "$XFSTESTS_REF" "$src" \
		"XFSTESTS=/path/to/xfstests-dev (a work tree or a bare git repository; XFSTESTS_REF= picks a commit)")
fi

# unionmount-testsuite: Python scripts, nothing to build. xfstests'
# overlay/100 to 117 run it against the overlay they set up; it goes with
# xfstests only.
um_src=$work/unionmount-testsuite
um_commit=none
if [ "$commit" != none ] && [ "$UNIONMOUNT" != none ]; then
	um_commit=$(fetch_source "$UNIONMOUNT" "$UNIONMOUNT_REF" "$um_src" \
		"UNIONMOUNT=/path/to/unionmount-testsuite (UNIONMOUNT_REF= picks a commit), or UNIONMOUNT=none")
fi

# The image is rebuilt when what goes into it changes, not for edits
# elsewhere in this script.
initsum=$(printf '%s\n%s\n%s\n%s\n' "$PACKAGES" "$INIT" "$SU" "$um_commit" | sha256sum | cut -c1-12)
dir=$CACHE/xfstests/$SUITE-$commit
img=$dir/root.img
if [ -f "$img" ] && [ "$(cat "$dir/recipe" 2>/dev/null)" = "$initsum" ]; then
	say "cached: $img (xfstests $commit, unionmount-testsuite $um_commit)"
	echo "$img"
	exit 0
fi

mkdir -p "$dir"
rm -f "$img" "$dir/recipe"
root=$dir/rootfs
m=$(mirror)
say "xfstests $commit, Debian $SUITE from $m; this takes several minutes"

# debootstrap is the longest step and the same for every recipe: a build
# stopped after it starts again from its result.
if [ -f "$dir/debootstrap.done" ] && [ -x "$root/usr/bin/apt-get" ]; then
	phase "reusing the debootstrap of an earlier build"
else
	rm -rf "$root" "$dir/debootstrap.done"
	phase "debootstrap --variant=minbase $SUITE"
	debootstrap --variant=minbase "$SUITE" "$root" "$m" >"$dir/debootstrap.log" 2>&1 ||
		{ tail -n 30 "$dir/debootstrap.log" >&2; die "debootstrap failed (log: $dir/debootstrap.log)"; }
	touch "$dir/debootstrap.done"
fi

mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
	DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"; }

phase "apt-get install $(echo "$PACKAGES" | wc -w) packages"
# Either failure ends here; PACKAGES is a list of names.
# shellcheck disable=SC2015,SC2086
in_root apt-get -q update >"$dir/apt.log" 2>&1 &&
	in_root apt-get -q -y install --no-install-recommends $PACKAGES >>"$dir/apt.log" 2>&1 ||
	{ tail -n 30 "$dir/apt.log" >&2; die "apt-get install failed (log: $dir/apt.log)"; }
in_root apt-get clean

rm -rf "$root/opt/xfstests"
if [ "$commit" != none ]; then
	phase "building xfstests"
	rm -rf "$src/.git"
	cp -a "$src" "$root/opt/xfstests"
	# shellcheck disable=SC2016 # nproc of the chroot's shell
	in_root sh -c 'cd /opt/xfstests && make -j"$(nproc)"' >"$dir/build.log" 2>&1 ||
		{ grep -iE 'error|fatal' "$dir/build.log" | head -n 20 >&2; tail -n 20 "$dir/build.log" >&2
		  die "xfstests build failed (log: $dir/build.log)"; }
	echo "$commit" >"$root/opt/xfstests/COMMIT"
fi
rm -rf "$root/opt/unionmount-testsuite"
if [ "$um_commit" != none ]; then
	rm -rf "$um_src/.git"
	cp -a "$um_src" "$root/opt/unionmount-testsuite"
	echo "$um_commit" >"$root/opt/unionmount-testsuite/COMMIT"
fi

# The users and groups xfstests' tests switch to.
in_root sh -c 'groupadd -f fsgqa; id fsgqa >/dev/null 2>&1 || useradd -m -g fsgqa fsgqa
	id fsgqa2 >/dev/null 2>&1 || useradd -m fsgqa2
	id 123456-fsgqa >/dev/null 2>&1 || useradd -m 123456-fsgqa' >>"$dir/build.log" 2>&1
printf '%s\n' "$SU" >"$root/usr/local/bin/su"
chmod 0755 "$root/usr/local/bin/su"
printf '%s\n' "$INIT" >"$root/sbin/ovlkit-xfstests-init"
chmod 0755 "$root/sbin/ovlkit-xfstests-init"
echo ovlkit-xfstests >"$root/etc/hostname"
: >"$root/etc/fstab"

umount "$root/dev/pts" "$root/dev" "$root/sys" "$root/proc"
rm -f "$root/etc/resolv.conf"

phase "writing $IMAGE_SIZE ext4 image"
mkfs.ext4 -q -F -L ovlkit-root -d "$root" "$img.tmp" "$IMAGE_SIZE" >&2 ||
	die "mkfs.ext4 -d failed"
mv "$img.tmp" "$img"
rm -rf "$root" "$dir/debootstrap.done"
root=""
echo "$initsum" >"$dir/recipe"
echo "$commit" >"$dir/commit"
echo "$um_commit" >"$dir/unionmount-commit"
phase "done: $img"
echo "$img"
