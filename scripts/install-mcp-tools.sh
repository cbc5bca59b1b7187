#!/usr/bin/env bash
# Installs the MCP clients pinned in .ci/mcp-versions under ~/.cache (once)
# and prints where they are, as shell assignments for `eval`:
#
#   CAPEXEC_NODE22=.../bin/node                 Node 22, from npm `node@22`
#   CAPEXEC_MCP_CONFORMANCE=.../dist/index.js   the conformance suite
#   CAPEXEC_MCP_PYTHON=.../bin/python           a venv with PyPI `mcp`
#
# Variables already set are printed unchanged. Each install is made beside
# its final place and renamed, so an interrupted one is never mistaken for a
# finished one.
set -euo pipefail
cd "$(dirname "$0")/.."

pinned() { sed -n "s/^$1=//p" .ci/mcp-versions | tr -d '[:space:]'; }
node_version=$(pinned node)
conformance_version=$(pinned conformance)
python_version=$(pinned mcp-python)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/capexec"

install_into() { # final-directory command...
    local final=$1
    shift
    local partial="$final.partial.$$"
    rm -rf "$partial"
    mkdir -p "$partial"
    "$@" "$partial" >&2
    rm -rf "$final"
    mv "$partial" "$final"
}

npm_install() {
    command -v npm >/dev/null || { echo "install-mcp-tools: npm is needed" >&2; exit 1; }
    scripts/npm-install.sh --prefix "$1" \
        "node@$node_version" "@modelcontextprotocol/conformance@$conformance_version"
}

venv_install() {
    local python
    python=$(command -v python3) || { echo "install-mcp-tools: python3 is needed" >&2; exit 1; }
    "$python" -m venv "$1"
    "$1/bin/pip" install --quiet --disable-pip-version-check "mcp==$python_version"
}

node_dir="$cache/mcp-node-$node_version-conformance-$conformance_version"
if [ -z "${CAPEXEC_NODE22-}" ] || [ -z "${CAPEXEC_MCP_CONFORMANCE-}" ]; then
    if [ ! -x "$node_dir/node_modules/.bin/node" ]; then
        install_into "$node_dir" npm_install
    fi
    CAPEXEC_NODE22=${CAPEXEC_NODE22:-$node_dir/node_modules/.bin/node}
    CAPEXEC_MCP_CONFORMANCE=${CAPEXEC_MCP_CONFORMANCE:-$node_dir/node_modules/@modelcontextprotocol/conformance/dist/index.js}
fi
"$CAPEXEC_NODE22" --version | grep -q "^v22\." \
    || { echo "install-mcp-tools: $CAPEXEC_NODE22 is not Node 22" >&2; exit 1; }

python_dir="$cache/mcp-python-$python_version"
if [ -z "${CAPEXEC_MCP_PYTHON-}" ]; then
    if [ ! -x "$python_dir/bin/python" ] || ! "$python_dir/bin/python" -c 'import mcp' 2>/dev/null; then
        install_into "$python_dir" venv_install
    fi
    CAPEXEC_MCP_PYTHON=$python_dir/bin/python
fi
"$CAPEXEC_MCP_PYTHON" -c 'import mcp' \
    || { echo "install-mcp-tools: $CAPEXEC_MCP_PYTHON cannot import mcp" >&2; exit 1; }

printf 'CAPEXEC_NODE22=%q\nCAPEXEC_MCP_CONFORMANCE=%q\nCAPEXEC_MCP_PYTHON=%q\n' \
    "$CAPEXEC_NODE22" "$CAPEXEC_MCP_CONFORMANCE" "$CAPEXEC_MCP_PYTHON"
