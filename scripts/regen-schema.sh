#!/usr/bin/env bash
# Regenerates schema/codegen-request.bin and its fingerprint from schema/*.capnp.
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

if ! command -v capnp >/dev/null; then
    echo "regen-schema: the capnp compiler is missing (apt-get install capnproto libcapnp-dev)" >&2
    exit 1
fi
include_dir=/usr/include
if [ ! -f "$include_dir/capnp/stream.capnp" ]; then
    echo "regen-schema: $include_dir/capnp/stream.capnp is missing (apt-get install libcapnp-dev)" >&2
    exit 1
fi

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
capnp compile -o- --src-prefix=schema -I"$include_dir" schema/*.capnp >"$tmp"
mv "$tmp" schema/codegen-request.bin
(cd schema && sha256sum -- *.capnp) >schema/codegen-request.sha256
echo "regen-schema: wrote schema/codegen-request.bin and schema/codegen-request.sha256"
