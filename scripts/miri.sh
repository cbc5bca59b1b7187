#!/usr/bin/env bash
# Runs the tests of the code that hands a buffer of capexec's to a Cap'n
# Proto message as its segment (src/segment.rs, and the messages built
# with it in src/net/outgoing_bytes.rs and src/rpc/subscription.rs) under
# Miri, which checks what the compiler cannot: that no reference is made
# over bytes a message shares (Stacked Borrows), no read of memory never
# written, no use after the message let go. The rest of the crate's tests
# make system calls Miri does not run.
#
# Needs a nightly toolchain (`rustup toolchain install nightly`); adds its
# `miri` and `rust-src` components if they are missing, and fails when it
# cannot. Miri's sysroot is built once into ~/.cache/miri, the crate into
# target/miri. About 4 minutes the first time on 2 cores, 2-3 after.
#
#   scripts/miri.sh            (CAPEXEC_MIRI_TOOLCHAIN=nightly-YYYY-MM-DD to pick one)
set -euo pipefail
cd "$(dirname "$0")/.."

toolchain=${CAPEXEC_MIRI_TOOLCHAIN:-nightly}
if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1; then
    echo "miri: no $toolchain toolchain (rustup toolchain install $toolchain --profile minimal)" >&2
    exit 1
fi
installed=$(rustup +"$toolchain" component list --installed)
for component in miri rust-src; do
    if ! grep -q "^$component" <<<"$installed"; then
        rustup +"$toolchain" component add "$component"
    fi
done

cargo +"$toolchain" miri test --target-dir target/miri --lib -- \
    segment::tests:: net::outgoing_bytes::tests:: rpc::subscription::tests::
