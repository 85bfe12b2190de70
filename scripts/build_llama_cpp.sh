#!/usr/bin/env bash
# Build the llama.cpp tools fitplan is checked against, once, into a cache.
#
# The source is the llama.cpp vendored in the llama-cpp-python sdist (DESIGN.md pins
# llama-cpp-python==0.3.36, llama.cpp commit 0c1e570). CPU backend plus RPC, so that
# ggml-rpc-server instances on 127.0.0.1 give llama.cpp real extra devices.
# GGML_NATIVE=OFF ("portable"): on x86-64 the CPU kernels are the AVX2/FMA/F16C ones on every
# machine, so llama.cpp's numbers do not depend on the CPU that built it and the runtime's
# bit-exact kernels (runtime/ggml/exact.py) have one target.
#
# The Vulkan variant (--vulkan, or FITPLAN_LLAMA_BACKEND=vulkan) builds the same source with
# GGML_VULKAN=ON against the distribution's Vulkan headers, glslc and loader (Debian 12:
# libvulkan-dev 1.3.239, glslc, spirv-headers; Mesa's lavapipe, a Vulkan device on the CPU, from
# mesa-vulkan-drivers), into llama.cpp-<version>-vulkan. Debian's 1.3.239 headers lack two things
# the pinned ggml-vulkan.cpp uses; scripts/vk_compat.h fills them and is force-included into that
# one file. Run the tools with GGML_VK_VISIBLE_DEVICES=0: ggml-vulkan skips CPU-type devices such
# as lavapipe unless they are named.
#
#   scripts/build_llama_cpp.sh            # build if the cache lacks a tool, else nothing
#   scripts/build_llama_cpp.sh --vulkan   # the Vulkan build (llama-fit-params, llama-cli, llama-server)
#   FITPLAN_LLAMA_CPP_DIR=/path ...       # another cache directory
#
# Prints the bin directory on its last line.
set -euo pipefail

backend="${FITPLAN_LLAMA_BACKEND:-cpu}"
for arg in "$@"; do
  case "$arg" in
    --vulkan) backend=vulkan ;;
    --cpu) backend=cpu ;;
    *) echo "build_llama_cpp: unknown argument $arg (expected --vulkan or --cpu)" >&2; exit 2 ;;
  esac
done
version="${FITPLAN_LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
here="$(cd "$(dirname "$0")" && pwd)"
case "$backend" in
  cpu)
    flavor=portable
    tools=(llama-fit-params llama-cli llama-server llama-bench ggml-rpc-server)
    ours=(fitplan-dump-nodes)
    backend_flags=(-DGGML_RPC=ON) ;;
  vulkan)
    flavor=vulkan
    tools=(llama-fit-params llama-cli llama-server)
    ours=()
    backend_flags=(-DGGML_VULKAN=ON) ;;
  *) echo "build_llama_cpp: FITPLAN_LLAMA_BACKEND=$backend: expected cpu or vulkan" >&2; exit 2 ;;
esac
cache="${FITPLAN_LLAMA_CPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fitplan/llama.cpp-$version-$flavor}"

have_all() {
  for t in "${tools[@]}" "${ours[@]}"; do [ -x "$cache/bin/$t" ] || return 1; done
}

if have_all; then
  echo "$cache/bin"
  exit 0
fi

command -v cmake >/dev/null || { echo "build_llama_cpp: cmake is required (apt-get install cmake)" >&2; exit 2; }
command -v c++ >/dev/null || { echo "build_llama_cpp: a C++ compiler is required (apt-get install g++)" >&2; exit 2; }
if [ "$backend" = vulkan ]; then
  command -v glslc >/dev/null || { echo "build_llama_cpp: glslc is required (apt-get install glslc)" >&2; exit 2; }
  [ -f /usr/include/vulkan/vulkan.hpp ] || [ -n "${VULKAN_SDK:-}" ] \
    || { echo "build_llama_cpp: the Vulkan headers are required (apt-get install libvulkan-dev spirv-headers)" >&2; exit 2; }
fi

work="$cache.work"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

( cd "$work" && python3 -m pip download --quiet --no-binary :all: --no-deps \
    "llama-cpp-python==$version" -d . )
tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
if [ "$backend" = vulkan ]; then
  # the shim into ggml-vulkan.cpp alone (the extracted copy is this build's own)
  cp "$here/vk_compat.h" "$work/vk_compat.h"
  echo "set_source_files_properties(ggml-vulkan.cpp PROPERTIES COMPILE_OPTIONS \"-include;$work/vk_compat.h\")" \
    >>"$src/ggml/src/ggml-vulkan/CMakeLists.txt"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# No network at build time: no prebuilt web UI, no TLS, no curl.
cmake -S "$src" -B "$work/build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  "${backend_flags[@]}" -DGGML_NATIVE=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DBUILD_SHARED_LIBS=OFF >"$work/configure.log" 2>&1 \
  || { tail -30 "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" -j "$(nproc)" --target "${tools[@]}" \
  >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; exit 1; }

mkdir -p "$cache.new/bin"
for t in "${tools[@]}"; do cp "$work/build/bin/$t" "$cache.new/bin/"; done
if [ "$backend" = cpu ]; then
# fitplan's node dump (tests compare the embedded runtime with llama.cpp node by node), linked
# against the libraries just built
lib="$work/build"
c++ -O2 -std=c++17 -fopenmp "$here/dump_nodes.cpp" -I"$src/include" -I"$src/ggml/include" \
  "$lib/src/libllama.a" "$lib/ggml/src/libggml.a" "$lib/ggml/src/libggml-cpu.a" \
  "$lib/ggml/src/ggml-rpc/libggml-rpc.a" "$lib/ggml/src/libggml-base.a" -lpthread -ldl \
  -o "$cache.new/bin/fitplan-dump-nodes" 2>"$work/dump.log" || { tail -20 "$work/dump.log" >&2; exit 1; }
fi
echo "llama-cpp-python==$version" >"$cache.new/VERSION"
rm -rf "$cache"
mv "$cache.new" "$cache"
echo "$cache/bin"
