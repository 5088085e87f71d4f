#!/bin/bash
# Runs in the Debian guest of scripts/xfstests-image.sh as /ovlkit/run.sh
# for "ovlvm readers": mounts overlays with each option set the host
# lists in /ovlkit/env (OPTION_SETS: one "mount options|shown options"
# per line) and reads what the
# kernel shows of them through the programs people run: util-linux's
# findmnt (/proc/self/mountinfo) and dmesg (/dev/kmsg), and trace-cmd
# (libtraceevent: the tracefs event formats). Every check is one test
# case in an xunit report on the control disk, read like xfstests' own.
#
# A check passes when the program exits 0 and what it printed, parsed by
# Python's json module where the program prints JSON, holds what the
# check expects. An option set the kernel refuses to mount is "not run"
# with the kernel's message; the host decides whether that is allowed.
set -u
# shellcheck source=/dev/null # written by the host for each run
. /ovlkit/env
# shellcheck source=guest_lib.sh
. /ovlkit/lib.sh

say() { echo "ovlkit-readers: $*"; }
out=/ovlkit/results
mkdir -p "$out/cases"
: >"$out/cases.tsv"

# record STATUS NAME MESSAGE [OUTPUT-FILE]
record() {
	local status=$1 name=$2 msg=$3 file=${4-}
	printf '%s\t%s\t%s\n' "$status" "$name" "${msg//$'\t'/ }" >>"$out/cases.tsv"
	if [ -n "$file" ] && [ -f "$file" ]; then
		cp "$file" "$out/cases/${name//\//_}.out"
	fi
	say "$status $name${msg:+: $msg}"
}

dev=$(disk ovlkit-xfstest) || { say "no test disk"; exit 1; }
mkdir -p /mnt/test
mount "$dev" /mnt/test || { say "cannot mount $dev"; exit 1; }
say "kernel $(uname -r), base $FSTYP on $dev; findmnt $(findmnt --version | awk '{print $NF}'), trace-cmd $(trace-cmd --version 2>&1 | awk '/version/ {print $3; exit}')"

log=/tmp/check.log json=/tmp/check.json

# Layer directories whose names hold what mountinfo must escape: a space
# and a tab (overlayfs itself takes a backslash for an escape, so none).
# findmnt has to give them back unescaped.
base=$'/mnt/test/readers/a dir\twith odd names'
n=0
while IFS='|' read -r opts show; do
	n=$((n + 1))
	name=readers/findmnt-$(printf '%02d' "$n")
	d=$base/$n
	mkdir -p "$d/lower/sub" "$d/upper" "$d/work" "$d/merged"
	echo data >"$d/lower/sub/file"
	mopts="lowerdir=$d/lower,upperdir=$d/upper,workdir=$d/work${opts:+,$opts}"
	# mount(8) splits options at commas, so the layer paths' escapes are
	# only what the kernel shows; the paths hold no comma.
	if ! mount -t overlay overlay -o "$mopts" "$d/merged" 2>"$log"; then
		record notrun "$name" "mount -o ${opts:-(no extra options)} refused: $(dmesg | tail -n 1)" "$log"
		continue
	fi
	echo more >>"$d/merged/sub/file" # a copy-up, so the mount has done work
	if findmnt -J -t overlay --mountpoint "$d/merged" -o TARGET,SOURCE,FSTYPE,OPTIONS >"$json" 2>"$log" &&
		python3 - "$d/merged" "$d/upper" "$show" "$json" <<'EOF' >"$log" 2>&1
import json, sys
target, upper, show, path = sys.argv[1:5]
doc = json.load(open(path))
fs = doc["filesystems"]
assert len(fs) == 1, "want one overlay at the mount point, findmnt shows %d" % len(fs)
fs = fs[0]
assert fs["target"] == target, "target %r, want %r" % (fs["target"], target)
assert fs["fstype"] == "overlay", fs["fstype"]
shown = fs["options"].split(",")
assert "upperdir=" + upper in shown, "upperdir=%r not among %r" % (upper, shown)
# Each expected option may have alternatives ("a/b"): what a kernel
# shows for the same mount differs where the series changes it.
for want in filter(None, show.split(",")):
    assert any(o in shown for o in want.split("/")), "option %r not among %r" % (want, shown)
print("findmnt shows", fs["options"])
EOF
	then
		record pass "$name" "${opts:-(no extra options)}" "$log"
	else
		record fail "$name" "findmnt -J of a mount with ${opts:-no extra options}" "$log"
	fi
	umount "$d/merged"
done <<<"$OPTION_SETS"

# Every mount above, and every other, read as a whole: findmnt must parse
# the kernel's complete mount table.
if findmnt -J >"$json" 2>"$log" && python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$json" 2>>"$log"; then
	record pass readers/findmnt-all "findmnt -J of the whole mount table" "$log"
else
	record fail readers/findmnt-all "findmnt -J of the whole mount table" "$log"
fi

# Kernel messages: an opaque xattr whose value holds a newline and a log
# level must reach dmesg as one record of the kernel's, with no record
# forged from the value. The kernels differ in what they print about the
# value (the series warns about invalid ones); the check is about the
# framing, which must hold on both.
d=$base/kmsg
# The value goes on the upper dir: overlayfs reads the opaque xattr of
# every layer but the lowest.
mkdir -p "$d/lower/opq" "$d/upper/opq" "$d/work" "$d/merged"
# At most 8 bytes: the series shows a longer value by its length only.
setfattr -n trusted.overlay.opaque -v $'\n<0>ZQZQ' "$d/upper/opq"
mount -t overlay overlay -o "lowerdir=$d/lower,upperdir=$d/upper,workdir=$d/work" "$d/merged" &&
	ls "$d/merged/opq" >/dev/null 2>&1
umount "$d/merged" 2>/dev/null
if dmesg -J >"$json" 2>"$log" && python3 - "$json" <<'EOF' >"$log" 2>&1
import json, sys
recs = json.load(open(sys.argv[1]))["dmesg"]
forged = [r for r in recs if r["msg"].lstrip().startswith("ZQZQ")]
assert not forged, "a record forged from an xattr value: %r" % forged
ovl = [r["msg"] for r in recs if r["msg"].startswith("overlayfs:")]
print("%d records, %d from overlayfs" % (len(recs), len(ovl)))
for m in ovl:
    print(m)
EOF
then
	record pass readers/dmesg-json "dmesg -J after an opaque xattr value with a newline" "$log"
else
	record fail readers/dmesg-json "dmesg -J after an opaque xattr value with a newline" "$log"
fi

# Trace events: trace-cmd (libtraceevent) parses each overlayfs event's
# format file to print its fields. The recorded command mounts, copies up
# and unmounts, so every event the kernel has fires, and each must be
# printed with its fields parsed. A kernel without overlayfs events
# (stock) has nothing to read: not run.
if [ -d /sys/kernel/tracing/events/overlayfs ]; then
	d=$base/trace
	mkdir -p "$d/lower" "$d/upper" "$d/work" "$d/merged"
	for i in 1 2 3; do echo "file $i" >"$d/lower/f$i"; done
	cat >/tmp/workload.sh <<EOF
mount -t overlay overlay -o "lowerdir=$d/lower,upperdir=$d/upper,workdir=$d/work" "$d/merged" || exit 1
for i in 1 2 3; do echo x >>"$d/merged/f\$i"; done
umount "$d/merged"
EOF
	events=()
	for e in /sys/kernel/tracing/events/overlayfs/*/; do
		events+=("$(basename "$e")")
	done
	if trace-cmd record -q -e overlayfs -o /tmp/trace.dat -- sh /tmp/workload.sh >"$log" 2>&1 &&
		trace-cmd report -i /tmp/trace.dat >/tmp/report.txt 2>>"$log"; then
		cat /tmp/report.txt >>"$log"
		missing=""
		for e in "${events[@]}"; do
			grep -q " $e: " /tmp/report.txt || missing+=" $e"
		done
		if grep -q 'FAILED TO PARSE' /tmp/report.txt; then
			record fail readers/trace-cmd "trace-cmd report could not parse an overlayfs event" "$log"
		elif [ -n "$missing" ]; then
			record fail readers/trace-cmd "trace-cmd report shows no${missing}" "$log"
		elif [ "$(grep -c ' ovl_copy_up_end: .* err=0 ' /tmp/report.txt)" -lt 3 ]; then
			record fail readers/trace-cmd "trace-cmd report shows fewer than 3 copy-ups ending with err=0" "$log"
		else
			record pass readers/trace-cmd "events: ${events[*]}" "$log"
		fi
	else
		record fail readers/trace-cmd "trace-cmd record or report failed" "$log"
	fi
else
	record notrun readers/trace-cmd "the kernel has no overlayfs trace events"
fi

umount /mnt/test
# The report, in the xunit form the host reads for xfstests too.
python3 - "$out" <<'EOF'
import os, sys
from xml.sax.saxutils import escape, quoteattr
out = sys.argv[1]
cases = []
for line in open(os.path.join(out, "cases.tsv")):
    status, name, msg = line.rstrip("\n").split("\t", 2)
    p = os.path.join(out, "cases", name.replace("/", "_") + ".out")
    body = open(p, errors="replace").read() if os.path.exists(p) else ""
    cases.append((status, name, msg, body))
with open(os.path.join(out, "result.xml"), "w") as f:
    f.write('<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name="ovlkit-readers" tests="%d">\n' % len(cases))
    for status, name, msg, body in cases:
        f.write('<testcase classname="ovlkit.readers" name=%s time="0">' % quoteattr(name))
        if status == "fail":
            f.write('<failure message=%s type="failure"/><system-err>%s</system-err>' % (quoteattr(msg), escape(body)))
        elif status == "notrun":
            f.write('<skipped message=%s/>' % quoteattr(msg))
        else:
            f.write('<system-out>%s</system-out>' % escape(body))
        f.write('</testcase>\n')
    f.write('</testsuite>\n')
EOF
dmesg >"$out/dmesg.txt"
echo 0 >"$out/check.rc"
sync
say "done"
