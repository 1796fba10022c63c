#!/bin/sh
# A software WebGPU adapter for a GPU-less Debian 12 (bookworm) machine: Mesa's lavapipe (Vulkan on
# the CPU) for `--backend webgpu`, for CI and for trying the GPU path without a GPU. It is correct but
# far slower than the wasm backend: use it to test, not to train.
#
# Dawn (npm `webgpu`) rejects bookworm's own Mesa 22.3.6 (it lacks the descriptor-indexing features
# Dawn requires), so lavapipe comes from Debian's bookworm-backports suite (Mesa 25). Its packages are
# downloaded with a private apt state and unpacked into DEST; the system's Mesa is not replaced. The
# Vulkan loader (libvulkan1) and LLVM 15 come from bookworm itself and are installed with apt.
#
# Usage (as root, or a user with sudo):  sh scripts/setup-webgpu-adapter.sh [DEST]
#        then, in the shell that runs node:  . DEST/env.sh
# DEST defaults to ~/.cache/mini-agentic-rl/webgpu-adapter. Running it again is a no-op.
# On a machine with a GPU none of this is needed: install the GPU's Vulkan driver instead.
set -eu
DEST=$(realpath -m "${1:-${XDG_CACHE_HOME:-$HOME/.cache}/mini-agentic-rl/webgpu-adapter}")
if [ -f "$DEST/env.sh" ]; then echo "webgpu adapter already set up: . $DEST/env.sh"; exit 0; fi
ARCH=$(dpkg --print-architecture 2>/dev/null || echo unknown)
case "$ARCH" in
  amd64) TRIPLE=x86_64-linux-gnu ;;
  arm64) TRIPLE=aarch64-linux-gnu ;;
  *) echo "setup-webgpu-adapter: needs Debian 12 on amd64 or arm64 (dpkg architecture: $ARCH)" >&2; exit 2 ;;
esac
if ! grep -q bookworm /etc/os-release 2>/dev/null; then
  echo "setup-webgpu-adapter: written for Debian 12 (bookworm); this is $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-an unknown system}")" >&2
  exit 2
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo

# 1. The Vulkan loader and LLVM 15 (lavapipe links it) from bookworm.
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends libvulkan1 libllvm15 >/dev/null

# 2. lavapipe and the libdrm it was built against, from bookworm-backports, into a private folder.
TMP="$DEST.tmp.$$"
rm -rf "$TMP"
mkdir -p "$TMP/apt/lists/partial" "$TMP/apt/cache/archives/partial" "$TMP/debs" "$TMP/root" "$TMP/xdg"
# the archive this machine already uses (deb822 .sources files or the classic sources.list)
URI=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -n 1 || true)
[ -n "$URI" ] || URI=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$URI" ] || URI=http://deb.debian.org/debian
printf 'deb %s bookworm-backports main\n' "$URI" > "$TMP/apt/sources.list"
O="-o Dir::Etc::SourceList=$TMP/apt/sources.list -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists=$TMP/apt/lists -o Dir::Cache=$TMP/apt/cache"
[ "$(id -u)" -ne 0 ] || O="$O -o APT::Sandbox::User=root"
apt-get $O update -qq
(cd "$TMP/debs" && apt-get $O download mesa-vulkan-drivers libdrm2 libdrm-amdgpu1 >/dev/null)
for d in "$TMP"/debs/*.deb; do dpkg-deb -x "$d" "$TMP/root"; done
rm -rf "$TMP/apt" "$TMP/debs"

# 3. An ICD manifest naming only lavapipe, and the environment that selects it.
LIB="$DEST/root/usr/lib/$TRIPLE"
[ -f "$TMP/root/usr/lib/$TRIPLE/libvulkan_lvp.so" ] || { echo "setup-webgpu-adapter: libvulkan_lvp.so missing from mesa-vulkan-drivers" >&2; exit 1; }
printf '{"file_format_version":"1.0.0","ICD":{"library_path":"%s/libvulkan_lvp.so","api_version":"1.3.0"}}\n' "$LIB" > "$TMP/lvp_icd.json"
chmod 700 "$TMP/xdg"
cat > "$TMP/env.sh" <<EOF
# Selects the software Vulkan adapter set up by scripts/setup-webgpu-adapter.sh.
export VK_ICD_FILENAMES=$DEST/lvp_icd.json
export LD_LIBRARY_PATH=$LIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export XDG_RUNTIME_DIR=\${XDG_RUNTIME_DIR:-$DEST/xdg}
EOF
rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
mv "$TMP" "$DEST"
echo "webgpu adapter ready (Mesa lavapipe): . $DEST/env.sh"
