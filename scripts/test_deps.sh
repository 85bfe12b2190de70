#!/usr/bin/env bash
# The Debian packages the tests use, installed when missing (non-interactively; as root, or with
# passwordless sudo). The README's test command and .ci/run both start with it.
set -uo pipefail

# What needs them:
# - the Vulkan peer tests (tests/peer/test_vulkan_peer.py) build the pinned llama.cpp with ggml-vulkan
#   against Debian's Vulkan packages and run it on Mesa's lavapipe (scripts/build_llama_cpp.sh --vulkan);
# - the systemd export test (tests/cli/test_export_cli.py) checks units with `systemd-analyze verify`;
# - the HTML report test (tests/cli/test_report_html.py) renders the page in headless Chromium, with a
#   font named (installs here skip recommended packages, where chromium's fonts come from).
packages=(libvulkan-dev glslc spirv-headers mesa-vulkan-drivers vulkan-tools systemd chromium fonts-liberation)
missing=()
if command -v dpkg-query >/dev/null; then
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
fi
if [ "${#missing[@]}" -gt 0 ]; then
  as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo -n)
  echo "test_deps: apt-get install ${missing[*]}"
  { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
    && "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
       "${missing[@]}"; } || { echo "test_deps: could not install ${missing[*]}" >&2; exit 1; }
fi

exit 0
