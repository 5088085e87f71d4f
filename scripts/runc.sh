#!/usr/bin/env bash
# Build a static runc for the guest's containers, once, into the cache, and
# print its path.
#
#   scripts/runc.sh
#
# The version is the one tools/runc/go.mod pins. runc is built with cgo (its
# nsenter part is C) and linked statically: the guest has no C library. It
# is built without the seccomp tag, so it needs neither libseccomp nor
# seccomp in the guest kernel.
. "$(dirname "$0")/lib.sh"

MOD=$OVLKIT_TOP/tools/runc
version=$(awk '$1 == "github.com/opencontainers/runc" { print $2 }' "$MOD/go.mod")
[ -n "$version" ] || die "tools/runc/go.mod requires no github.com/opencontainers/runc"
out=$CACHE/bin/runc-$version
if [ -x "$out" ]; then
	echo "$out"
	exit 0
fi
command -v gcc >/dev/null || die "gcc is missing (run scripts/deps.sh)"
mkdir -p "$CACHE/bin"
rm -f "$out.tmp"
phase "build runc $version (static, cgo)" "$CACHE/bin/runc-build.log" \
	env -C "$MOD" CGO_ENABLED=1 GOFLAGS=-mod=readonly go build -trimpath \
	-tags "netgo osusergo urfave_cli_no_docs" \
	-ldflags "-s -w -X main.version=${version#v} -extldflags -static" \
	-o "$out.tmp" github.com/opencontainers/runc
# A dynamically linked runc would start on the host and fail in the guest.
if ! file "$out.tmp" | grep -q 'statically linked'; then
	die "runc is not statically linked: $(file "$out.tmp")"
fi
"$out.tmp" --version | head -n 1 | grep -qF "runc version ${version#v}" ||
	die "the built runc does not report version ${version#v}"
mv "$out.tmp" "$out"
echo "$out"
