#!/usr/bin/env bash
# The Python package carries its own copy of the wire schema (so that
# `pip install ./python` needs nothing else from the repository): fails if
# that copy differs from schema/capexec.capnp.
set -euo pipefail
cd "$(dirname "$0")/.."
copy=python/src/capexec/schema/capexec.capnp
if ! cmp -s schema/capexec.capnp "$copy"; then
    echo "$copy differs from schema/capexec.capnp; copy it again:" >&2
    echo "    cp schema/capexec.capnp $copy" >&2
    exit 1
fi
