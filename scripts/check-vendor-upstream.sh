#!/usr/bin/env bash
# Runs each fix's regression test on capnp-rpc's own test harness
# (capnproto-rust, capnp-rpc/test/): for every patch of
# vendor/capnp-rpc-patches/ that has a test in
# vendor/capnp-rpc-patches/upstream-test/ (same NNNN-name.patch), the test
# is run on the published crate plus the patches before it (it must fail)
# and plus the patch itself (it must pass). Exit 0 when every test fails
# before and passes after; the failing line of each "before" run is
# printed.
#
# Not in CI: it needs the network (capnproto-rust's tree, and the crates
# capnp, capnpc and futures from crates.io) and builds a second copy of
# capnp-rpc. Run it by hand when a patch or its test changes.
#
#   CAPNPROTO_RUST_GIT=DIR  a git directory of capnproto-rust to take the
#                           harness from (default: a clone of
#                           https://github.com/capnproto/capnproto-rust)
#   HARNESS_REF=REF         the harness's revision (default capnp-rpc-v0.27.0:
#                           see vendor/capnp-rpc-patches/README)
#   ONLY=NNNN               runs the test of patch NNNN only
#   SCRATCH=DIR             where to build (default target/upstream); its
#                           target/ is reused between runs
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
patches=$root/vendor/capnp-rpc-patches
tests=$patches/upstream-test
scratch=${SCRATCH:-$root/target/upstream}
ref=${HARNESS_REF:-capnp-rpc-v0.27.0}

field() { sed -n "s/^$1 = //p" "$patches/PRISTINE"; }
name=$(field name)
version=$(field version)
mkdir -p "$scratch"

# The published crate: scripts/check-vendor.sh fetches and checks it.
scripts/check-vendor.sh >/dev/null
crate=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/cache" -name "$name-$version.crate" | head -n 1)
rm -rf "$scratch/pristine" && mkdir -p "$scratch/pristine"
tar -xzf "$crate" -C "$scratch/pristine"
pristine=$scratch/pristine/$name-$version

git_dir=${CAPNPROTO_RUST_GIT:-}
if [ -z "$git_dir" ]; then
    git_dir=$scratch/capnproto-rust.git
    [ -d "$git_dir" ] || git clone --bare -q https://github.com/capnproto/capnproto-rust "$git_dir"
fi
rm -rf "$scratch/harness" && mkdir -p "$scratch/harness"
git --git-dir="$git_dir" archive "$ref" capnp-rpc/test async-byte-channel | tar -x -C "$scratch/harness"

# The tree: a workspace of capnp-rpc (the crate), its test crate and
# async-byte-channel; capnp and capnpc come from crates.io at the versions
# capnp-rpc was published with.
tree=$scratch/tree
rm -rf "$tree" && mkdir -p "$tree"
cat >"$tree/Cargo.toml" <<'TOML'
[workspace]
resolver = "2"
members = ["capnp-rpc", "capnp-rpc/test", "async-byte-channel"]

[workspace.lints.rust]
unreachable_pub = "deny"

[workspace.lints.clippy]
type_complexity = "allow"
missing_safety_doc = "allow"
TOML
cp -a "$scratch/harness/async-byte-channel" "$tree/"

# Puts the crate plus patches 1..$1, the harness's shared helpers (the
# upstream tests without a "Test:" line) and the upstream tests $2... in the
# tree.
prepare() {
    local upto=$1
    shift
    rm -rf "$tree/capnp-rpc" && cp -a "$pristine" "$tree/capnp-rpc"
    rm -f "$tree/capnp-rpc/Cargo.toml.orig" "$tree/capnp-rpc/Cargo.lock" "$tree/capnp-rpc/.cargo_vcs_info.json"
    local p
    for p in "$patches"/[0-9][0-9][0-9][0-9]-*.patch; do
        [ "$((10#$(basename "$p" | cut -c1-4)))" -le "$upto" ] || break
        patch -s -p1 --batch -d "$tree/capnp-rpc" <"$p"
    done
    cp -a "$scratch/harness/capnp-rpc/test" "$tree/capnp-rpc/test"
    sed -i 's|capnpc = { path = "../../capnpc" }|capnpc = "=0.27.0"|; s|capnp = { path = "../../capnp" }|capnp = "=0.27.3"|' \
        "$tree/capnp-rpc/test/Cargo.toml"
    # Each upstream test is made against the harness alone; together, their
    # `pub mod` lines in test.rs sit side by side, hence the fuzz.
    for p in "${helpers[@]}" "$@"; do
        patch -s -p1 --batch --fuzz=3 -d "$tree" <"$p" >/dev/null
    done
    # Cargo rebuilds a path crate only when a source is newer than its last
    # build, and the copies keep the published crate's old times: the crate
    # put back without a patch (0001's "before": every file as published)
    # would pass for fresh and the build of the last run be tested.
    find "$tree/capnp-rpc" -type f -exec touch {} +
}

# Runs the tests matching $1 in the tree; prints the outcome line; returns
# 0 when at least one test ran and all passed.
run() {
    local out status=0
    out=$(cd "$tree" && RUST_BACKTRACE=0 CARGO_TARGET_DIR=$scratch/target cargo test -q -p capnp-rpc-test --lib -- "$1" 2>&1) || status=$?
    if [ $status -eq 0 ] && grep -qE '^test result: ok\. [1-9]' <<<"$out"; then
        grep -m1 -E '^test result' <<<"$out"
        return 0
    fi
    grep -m1 -E "^error(\[E[0-9]+\])?:|overflowed|panicked at" -A2 <<<"$out" | grep -v '^note:' | tr '\n' ' ' || tail -n 3 <<<"$out"
    echo
    return 1
}

helpers=()
with_tests=()
for t in "$tests"/[0-9][0-9][0-9][0-9]-*.patch; do
    if grep -q '^Test: ' "$t"; then with_tests+=("$t"); else helpers+=("$t"); fi
done

failures=0
for t in "${with_tests[@]}"; do
    n=$((10#$(basename "$t" | cut -c1-4)))
    [ -z "${ONLY:-}" ] || [ "$n" -eq "$((10#$ONLY))" ] || continue
    filter=$(sed -n 's/^Test: //p' "$t")
    prepare "$((n - 1))" "$t"
    if line=$(run "$filter"); then
        echo "FAIL $(basename "$t" .patch) $filter passes without its patch: $line"
        failures=$((failures + 1))
    else
        echo "ok   $(basename "$t" .patch) $filter fails without its patch: $line"
    fi
    prepare "$n" "$t"
    if line=$(run "$filter"); then
        echo "ok   $(basename "$t" .patch) $filter passes with it: $line"
    else
        echo "FAIL $(basename "$t" .patch) $filter fails with its patch: $line"
        failures=$((failures + 1))
    fi
done
[ $failures -eq 0 ] || { echo "check-vendor-upstream: $failures unexpected results" >&2; exit 1; }
echo "check-vendor-upstream: every upstream test fails without its patch and passes with it"
