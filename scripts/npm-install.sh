#!/usr/bin/env bash
# `npm install --no-audit --no-fund "$@"`, tried up to three times: the npm
# registry is reached over the network, and one failed download must not
# fail a CI run. npm's own errors are printed (to stderr) on every failed
# try, so a lasting failure says why.
set -uo pipefail

for try in 1 2 3; do
    if npm install --loglevel=error --no-audit --no-fund "$@" >&2; then
        exit 0
    fi
    echo "npm-install: try $try of 3 failed: npm install $*" >&2
    [ "$try" -lt 3 ] && sleep $((try * 5))
done
exit 1
