#!/usr/bin/env bash
# Record llama.cpp's own memory figures on a real NVIDIA GPU, in two parts (issue: CUDA truth).
#
#   scripts/gpu_peer.sh build            # here, before any GPU time: the pinned llama.cpp with CUDA
#                                        # (sm_90) and RPC, packed with the gguf wheel into .gpu/
#   scripts/gpu_peer.sh measure          # on the GPU machine: unpack .gpu/, write the models, run the
#                                        # matrix (scripts/gpu_peer.py), write $OUT/<gpu>.json
#   FITPLAN_CUDA_ARCH=89 scripts/gpu_peer.sh build   # another GPU: its compute capability, no dot
#   scripts/gpu_peer.sh build --cpu      # the rehearsal: the same payload from the portable CPU build
#   scripts/gpu_peer.sh measure --cpu    # the same matrix on the CPU backend, on this machine
#
# Build: llama-cpp-python==0.3.36's vendored llama.cpp (DESIGN.md's pin) with -DGGML_CUDA=ON
# -DGGML_RPC=ON -DCMAKE_CUDA_ARCHITECTURES=90, shared libraries with RPATH $ORIGIN, only
# llama-fit-params, llama-server, llama-bench and ggml-rpc-server, stripped. The compiler is CUDA 13.x's nvcc
# (here the PyPI wheels nvidia-cuda-nvcc/-runtime/-cccl under /usr/local/cuda; FITPLAN_CUDA_HOME
# moves it). cuBLAS's headers and link-time library come from the PyPI wheel nvidia-cublas (13.x),
# downloaded into the work directory and not packed: the binaries need libcublas.so.13, which the GPU
# machine has among PyTorch's CUDA 13 wheels, and `measure` finds it there. The driver library
# (libcuda.so.1) is the GPU machine's too; the link here uses a stub holding the eleven driver-API
# entry points ggml-cuda calls (its VMM pool, cuGetErrorString), written by this script.
#
# On the GPU machine, after `build` here: copy the working tree and .gpu/llama-cuda.tar.xz there, run
#   scripts/gpu_peer.sh measure --out DIR
# and commit the DIR/<gpu>.json it writes as tests/peer/data/cuda/<gpu>.json.
#
# Measure: needs python3 with numpy and pyyaml (the gguf wheel travels in the payload), the working tree
# (scripts/gpu_peer.py and planner/synth write the model files there), nvidia-smi. It stays
# under five minutes on an H200; FITPLAN_GPU_PEER_BUDGET_S bounds it.
set -euo pipefail

version="${FITPLAN_LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
arch="${FITPLAN_CUDA_ARCH:-90}"
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/fitplan"
payload_dir="$repo/.gpu"
tools=(llama-fit-params llama-server llama-bench ggml-rpc-server)

usage() { echo "usage: scripts/gpu_peer.sh build|measure [--cpu] [--out FILE]" >&2; exit 2; }
[ $# -ge 1 ] || usage
part="$1"; shift
backend=cuda
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) backend=cpu ;;
    --cuda) backend=cuda ;;
    --out) out="$2"; shift ;;
    *) echo "gpu_peer: unknown argument $1" >&2; usage ;;
  esac
  shift
done
payload="$payload_dir/llama-$backend.tar.xz"

# The eleven CUDA driver-API functions the pinned ggml-cuda calls (ggml-cuda.cu: the VMM pool and
# device attribute queries; common.cuh: cuGetErrorString). Only their names matter to the linker;
# the GPU machine's libcuda.so.1 provides them at run time.
driver_stub() {
  local dir="$1"
  mkdir -p "$dir"
  {
    for f in cuDeviceGet cuDeviceGetAttribute cuGetErrorString cuMemAddressFree cuMemAddressReserve \
             cuMemCreate cuMemGetAllocationGranularity cuMemMap cuMemRelease cuMemSetAccess cuMemUnmap; do
      echo "int $f(void) { return 999; }"
    done
  } >"$dir/stub.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$dir/libcuda.so" "$dir/stub.c"
  ln -sf libcuda.so "$dir/libcuda.so.1"
}

fetch_source() {
  local work="$1"
  ( cd "$work" && python3 -m pip download --quiet --no-binary :all: --no-deps "llama-cpp-python==$version" -d . )
  tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
  echo "$work/llama_cpp_python-$version/vendor/llama.cpp"
}

gguf_wheel() {
  local dest="$1"
  local spec
  spec="gguf==$(python3 -c 'import importlib.metadata as m; print(m.version("gguf"))')"
  python3 -m pip download --quiet --no-deps --only-binary :all: "$spec" -d "$dest"
}

build_cuda() {
  local cuda_home="${FITPLAN_CUDA_HOME:-/usr/local/cuda}"
  local nvcc="$cuda_home/bin/nvcc"
  [ -x "$nvcc" ] || { echo "gpu_peer: no nvcc at $nvcc: pip install 'nvidia-cuda-nvcc==13.0.*' 'nvidia-cuda-runtime==13.0.*' 'nvidia-cuda-cccl==13.0.*' and set FITPLAN_CUDA_HOME" >&2; exit 2; }
  "$nvcc" --version | grep -q "release 13\." || { echo "gpu_peer: $nvcc is not CUDA 13.x" >&2; exit 2; }
  local cache="$cache_root/llama.cpp-$version-cuda-sm$arch"
  local have=1 t
  for t in "${tools[@]}"; do [ -x "$cache/bin/$t" ] || have=0; done
  if [ "$have" = 1 ]; then
    echo "gpu_peer: cached build $cache" >&2
  else
    local work="$cache.work"
    local src="$work/llama_cpp_python-$version/vendor/llama.cpp"
    # an interrupted build resumes (the CUDA kernels take over an hour on 2 cores)
    if [ ! -f "$work/build/CMakeCache.txt" ]; then
      rm -rf "$work"; mkdir -p "$work"
      fetch_source "$work" >/dev/null
      python3 -m pip download --quiet --no-deps --only-binary :all: 'nvidia-cublas>=13,<14' -d "$work/wheels"
      mkdir -p "$work/cublas"
      ( cd "$work/cublas" && python3 -m zipfile -e "$work"/wheels/nvidia_cublas-*.whl . )
      driver_stub "$work/stubs"
      date +%s >"$work/started"
    fi
    local cublas; cublas="$(dirname "$(find "$work/cublas" -name cublas_v2.h | head -1)")/.."
    cublas="$(cd "$cublas" && pwd)"
    ln -sf libcublas.so.13 "$cublas/lib/libcublas.so"
    ln -sf libcublasLt.so.13 "$cublas/lib/libcublasLt.so"
    # executables linked against libggml-cuda.so need its own needs resolved at link time
    local rpath_link="-Wl,-rpath-link,$cublas/lib -Wl,-rpath-link,$work/stubs"
    local generator=()
    command -v ninja >/dev/null && generator=(-G Ninja)
    PATH="$cuda_home/bin:$PATH" cmake -S "$src" -B "$work/build" "${generator[@]}" \
      -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_CUDA=ON -DGGML_RPC=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$nvcc" -DCUDAToolkit_ROOT="$cuda_home" \
      -DCUDA_cublas_LIBRARY="$cublas/lib/libcublas.so" -DCUDA_cublasLt_LIBRARY="$cublas/lib/libcublasLt.so" \
      -DCUDA_cuda_driver_LIBRARY="$work/stubs/libcuda.so" \
      -DCMAKE_CUDA_FLAGS="-isystem $cublas/include" -DCMAKE_CXX_FLAGS="-isystem $cublas/include" \
      -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN' \
      -DCMAKE_EXE_LINKER_FLAGS="$rpath_link" -DCMAKE_SHARED_LINKER_FLAGS="$rpath_link" \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
      -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >"$work/configure.log" 2>&1 \
      || { tail -30 "$work/configure.log" >&2; exit 1; }
    PATH="$cuda_home/bin:$PATH" cmake --build "$work/build" -j "$(nproc)" --target "${tools[@]}" \
      >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; exit 1; }
    rm -rf "$cache.new"; mkdir -p "$cache.new/bin"
    for t in "${tools[@]}"; do cp "$work/build/bin/$t" "$cache.new/bin/"; done
    cp -P "$work"/build/bin/*.so* "$cache.new/bin/"
    strip --strip-unneeded "$cache.new"/bin/*
    { echo "llama-cpp-python==$version"; echo "cuda: $("$nvcc" --version | tail -1)";
      echo "cublas headers: $(basename "$work"/wheels/nvidia_cublas-*.whl)"; echo "arch: sm_$arch";
      echo "build seconds: $(( $(date +%s) - $(cat "$work/started") )) wall on $(nproc) cores, resumed runs included"; } \
      >"$cache.new/VERSION"
    rm -rf "$cache"; mv "$cache.new" "$cache"; rm -rf "$work"
  fi
  pack "$cache/bin"
}

build_cpu() {
  local bin
  bin="$("$here/build_llama_cpp.sh" | tail -1)"
  pack "$bin"
}

# The payload: the tools and their libraries under bin/, the gguf wheel under wheels/, one tar.xz.
pack() {
  local bin="$1"
  local stage="$payload_dir/stage-$backend"
  rm -rf "$stage"; mkdir -p "$stage/bin" "$stage/wheels"
  for t in "${tools[@]}"; do cp "$bin/$t" "$stage/bin/"; done
  cp -P "$bin"/*.so* "$stage/bin/" 2>/dev/null || true
  [ -f "$bin/../VERSION" ] && cp "$bin/../VERSION" "$stage/VERSION"
  gguf_wheel "$stage/wheels"
  mkdir -p "$payload_dir"
  tar -C "$stage" -cJf "$payload.partial" . && mv "$payload.partial" "$payload"
  rm -rf "$stage"
  local size; size=$(stat -c %s "$payload")
  echo "gpu_peer: $payload $((size / 1048576)) MiB" >&2
  [ "$size" -lt $((60 * 1048576)) ] || { echo "gpu_peer: the payload is over 60 MiB" >&2; exit 1; }
}

# On the GPU machine: libcublas.so.13 from PyTorch's CUDA 13 wheels (nvidia/cu13/lib or
# nvidia/cublas/lib), libcudart.so.13 from there or the toolkit.
cuda_library_path() {
  python3 - <<'EOF'
import glob, os, site, sys
roots = [p for p in sys.path if p.endswith("-packages") or os.path.isdir(os.path.join(p, "nvidia"))]
roots += site.getsitepackages() + [site.getusersitepackages(), "/usr/local/cuda/lib64", "/usr/local/cuda/lib"]
dirs = []
for name in ("libcublas.so.13", "libcublasLt.so.13", "libcudart.so.13"):
    for root in roots:
        hits = glob.glob(os.path.join(root, "**", name), recursive=True) if os.path.isdir(root) else []
        if hits:
            d = os.path.dirname(hits[0])
            if d not in dirs:
                dirs.append(d)
            break
    else:
        sys.exit(f"gpu_peer: {name} not found under {roots}")
print(":".join(dirs))
EOF
}

measure() {
  [ -f "$payload" ] || { echo "gpu_peer: no payload $payload: run scripts/gpu_peer.sh build${backend/cuda/}${backend/cpu/ --cpu} first" >&2; exit 2; }
  local root="${TMPDIR:-/tmp}/fitplan-gpu-peer-$backend"
  rm -rf "$root"; mkdir -p "$root/site"
  tar -C "$root" -xJf "$payload"
  if ! python3 -c 'import gguf' 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$root/site" "$root"/wheels/*.whl
  fi
  export PYTHONPATH="$repo:$root/site${PYTHONPATH:+:$PYTHONPATH}"
  if [ "$backend" = cuda ]; then
    LD_LIBRARY_PATH="$(cuda_library_path)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export LD_LIBRARY_PATH
  fi
  [ -n "$out" ] || out="${OUT:-$root}"   # a directory: the file is named after the device
  local rc=0
  PYTHONUNBUFFERED=1 python3 "$here/gpu_peer.py" measure --backend "$backend" --bin "$root/bin" \
    --work "$root/work" --out "$out" --version-file "$root/VERSION" || rc=$?
  # the real loads' logs beside the record, for reading what a load said (not the model files)
  [ -d "$out" ] && tar -C "$root/work" --exclude=models -cJf "$out/logs.tar.xz" . || true
  return "$rc"
}

case "$part" in
  build) if [ "$backend" = cuda ]; then build_cuda; else build_cpu; fi ;;
  measure) measure ;;
  *) usage ;;
esac
