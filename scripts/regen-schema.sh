#!/usr/bin/env bash
# Regenerates schema/codegen-request.bin and its fingerprint from schema/*.capnp.
#
#   scripts/regen-schema.sh          rewrite both files
#   scripts/regen-schema.sh --check  fail if they are not what the schema gives
#
# build.rs turns the committed request into Rust with capnpc, so building needs
# no `capnp` binary; this script is the only place that needs one. Run it after
# every schema change and commit both outputs.
#
# Needs Debian's `capnproto` (the compiler) and `libcapnp-dev` (stream.capnp,
# imported by every `-> stream` method).
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."

check=false
case "${1-}" in
    --check) check=true ;;
    "") ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

if ! command -v capnp >/dev/null; then
    echo "regen-schema: the capnp compiler is missing (apt-get install capnproto libcapnp-dev)" >&2
    exit 1
fi
include_dir=/usr/include
if [ ! -f "$include_dir/capnp/stream.capnp" ]; then
    echo "regen-schema: $include_dir/capnp/stream.capnp is missing (apt-get install libcapnp-dev)" >&2
    exit 1
fi

request=$(mktemp)
fingerprint=$(mktemp)
trap 'rm -f "$request" "$fingerprint"' EXIT
capnp compile -o- --src-prefix=schema -I"$include_dir" schema/*.capnp >"$request"
(cd schema && sha256sum -- *.capnp) >"$fingerprint"

if $check; then
    if cmp -s "$request" schema/codegen-request.bin && cmp -s "$fingerprint" schema/codegen-request.sha256; then
        echo "regen-schema: schema/codegen-request.* are up to date"
        exit 0
    fi
    echo "regen-schema: schema/codegen-request.* are stale; run scripts/regen-schema.sh and commit the result" >&2
    exit 1
fi
cp "$request" schema/codegen-request.bin
cp "$fingerprint" schema/codegen-request.sha256
echo "regen-schema: wrote schema/codegen-request.bin and schema/codegen-request.sha256"
