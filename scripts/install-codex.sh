#!/usr/bin/env bash
# Installs the pinned OpenAI Codex (npm `@openai/codex`, a static binary inside
# the package) under ~/.cache and prints the binary's path. The version lives in
# one place, .ci/codex-version; tests and benchmarks find the binary through
# this script (or $CAPEXEC_CODEX, which it prints unchanged when set).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${CAPEXEC_CODEX-}" ]; then
    printf '%s\n' "$CAPEXEC_CODEX"
    exit 0
fi

version=$(tr -d '[:space:]' < .ci/codex-version)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/capexec/codex-$version"
binary="$cache/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"

if [ ! -x "$binary" ]; then
    command -v npm >/dev/null || { echo "install-codex: npm is needed to install @openai/codex@$version" >&2; exit 1; }
    # Install beside the final place and rename, so an interrupted install is
    # never mistaken for a finished one.
    partial="$cache.partial.$$"
    rm -rf "$partial"
    mkdir -p "$partial"
    scripts/npm-install.sh --prefix "$partial" "@openai/codex@$version"
    rm -rf "$cache"
    mv "$partial" "$cache"
fi
"$binary" --version >/dev/null
printf '%s\n' "$binary"
