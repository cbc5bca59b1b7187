#!/usr/bin/env bash
# Checks that vendor/capnp-rpc/ is the crate named in
# vendor/capnp-rpc-patches/PRISTINE, as published (its .crate's sha256
# checked), with the patches of vendor/capnp-rpc-patches/ applied in order:
# the tree holds no change that is not in a patch, and every patch applies.
# Exit 0 when they agree; otherwise the difference is printed and it exits 1.
#
# The .crate comes from cargo's cache (~/.cargo/registry/cache); when it is
# not there, a scratch project depending on the crate fetches it once
# (cargo fetch), after which the check runs offline.
#
#   CAPEXEC_VENDOR_TREE=DIR  compares DIR instead of vendor/capnp-rpc/
#                            (to try the check on a modified copy).
set -euo pipefail
cd "$(dirname "$0")/.."

patches=vendor/capnp-rpc-patches
tree=${CAPEXEC_VENDOR_TREE:-vendor/capnp-rpc}

field() { sed -n "s/^$1 = //p" "$patches/PRISTINE"; }
name=$(field name)
version=$(field version)
sha256=$(field sha256)
mapfile -t not_imported < <(field not-imported)
mapfile -t capexec_only < <(field capexec-only)

cargo_home=${CARGO_HOME:-$HOME/.cargo}
find_crate() {
    # (no cache directory yet is no crate yet)
    find "$cargo_home/registry/cache" -name "$name-$version.crate" 2>/dev/null | head -n 1 || true
}

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

crate=$(find_crate)
if [ -z "$crate" ]; then
    # The workspace builds this crate from vendor/ ([patch.crates-io]), so
    # its own `cargo fetch` never downloads the published one.
    mkdir -p "$scratch/fetch/src"
    cat >"$scratch/fetch/Cargo.toml" <<TOML
[package]
name = "fetch-pristine"
version = "0.0.0"
edition = "2021"

[dependencies]
$name = "=$version"
TOML
    : >"$scratch/fetch/src/lib.rs"
    (cd "$scratch/fetch" && cargo fetch -q)
    crate=$(find_crate)
    [ -n "$crate" ] || { echo "check-vendor: $name-$version.crate not in $cargo_home/registry/cache after cargo fetch" >&2; exit 1; }
fi

actual=$(sha256sum "$crate" | cut -d' ' -f1)
if [ "$actual" != "$sha256" ]; then
    echo "check-vendor: $crate has sha256 $actual, $patches/PRISTINE says $sha256" >&2
    exit 1
fi

tar -xzf "$crate" -C "$scratch"
expected="$scratch/$name-$version"
for file in "${not_imported[@]}"; do
    rm -f "$expected/$file"
done

shopt -s nullglob
for patch in "$patches"/[0-9][0-9][0-9][0-9]-*.patch; do
    if ! out=$(patch -p1 --batch --forward --no-backup-if-mismatch --reject-file=- -d "$expected" <"$patch" 2>&1); then
        echo "check-vendor: $patch does not apply to $name $version plus the patches before it:" >&2
        echo "$out" >&2
        exit 1
    fi
    # Fuzz or offset would let a patch drift from the tree it describes.
    if grep -qE 'with fuzz|offset' <<<"$out"; then
        echo "check-vendor: $patch applies only inexactly (refresh it):" >&2
        echo "$out" >&2
        exit 1
    fi
done

excludes=()
for file in "${capexec_only[@]}"; do
    excludes+=(-x "$file")
done
if ! diff -ru "${excludes[@]}" "$expected" "$tree" >"$scratch/difference"; then
    sed -e "s|$expected|$name-$version+patches|g" "$scratch/difference"
    echo "check-vendor: $tree differs from $name $version plus $patches/*.patch (above); make the change a patch, or refresh one (docs/DEVELOPMENT.md)" >&2
    exit 1
fi
for file in "${capexec_only[@]}"; do
    [ -e "$tree/$file" ] || { echo "check-vendor: $tree/$file, listed in PRISTINE, is missing" >&2; exit 1; }
done
echo "check-vendor: $tree is $name $version plus $(ls "$patches"/[0-9][0-9][0-9][0-9]-*.patch | wc -l) patches"
