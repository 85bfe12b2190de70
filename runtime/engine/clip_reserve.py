"""The multimodal projector's reserve: what clip.cpp allocates when llama-server loads it — the
weights buffer and the compute buffers of the warmup graph (runtime/engine/clip.py builds it),
reserved through the runtime's scheduler and allocator.

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd/clip.cpp):
- clip_ctx::clip_ctx: the projector runs on one backend plus the CPU (`use_gpu` with a `device`,
  else the first GPU-type device, else the first iGPU, else the CPU alone), in a scheduler made
  with parallel=false and op_offload=true; graphs up to max_nodes = 8192.
- clip_model_loader::load_tensors: every tensor the loader asks for goes into one buffer of that
  backend's default buffer type (ggml_backend_alloc_ctx_tensors_from_buft), usage WEIGHTS.
- clip_model_loader::warmup / reserve_compute_meta: with flash attention `auto` the graph is reserved
  with it enabled, and again disabled only when the backend refuses the FLASH_ATTN_EXT node (the
  allocator's buffers only grow, so the larger reserve stays).
- clip_init: a file with a vision and an audio encoder loads two clip_ctx, each with its own weights
  buffer and warmup reserve on the same backend (Gemma 4's: FAMILIES, _plus_audio); Gemma 3n's audio
  half is skipped.
- FAMILIES: the projector types whose builder is a module of its own (clip_gemma4, clip_gemma4a,
  clip_mobilenetv5, clip_llama4, clip_glm4v).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from gguf import Keys, VisionProjectorType

from planner.core.errors import BadInput
from planner.gguf.reader import ModelFile
from planner.llama.placement import CPU, Device
from runtime.engine.clip import CLIP_SIZED_OPS, SiglipGraph
from runtime.engine.clip_gemma4 import (
    GEMMA4UV,
    GEMMA4V,
    Gemma4UVGraph,
    Gemma4VGraph,
    gemma4_tensor_names,
    read_gemma4_hparams,
)
from runtime.engine.clip_gemma4a import (
    GEMMA4A,
    GEMMA4UA,
    Gemma4AGraph,
    Gemma4UAGraph,
    gemma4a_tensor_names,
    is_audio_tensor,
    read_gemma4a_hparams,
)
from runtime.engine.clip_glm4v import GLM4V, Glm4VGraph, glm4v_tensor_names, read_glm4v_hparams
from runtime.engine.clip_hparams import ClipHParams, load_weights, projector_type, read_clip_hparams
from runtime.engine.clip_llama4 import LLAMA4, Llama4Graph, llama4_tensor_names, read_llama4_hparams
from runtime.engine.clip_mobilenetv5 import (
    GEMMA3NV,
    MobileNetV5Graph,
    gemma3n_left_in_file,
    mobilenet_tensor_names,
    read_mobilenet_hparams,
)
from runtime.engine.clip_pixtral import PixtralGraph, pixtral_tensor_names, read_pixtral_hparams
from runtime.engine.clip_qwen2vl import (
    QWEN2VL_TYPES,
    Qwen2VLGraph,
    Qwen3VLGraph,
    QwenVLHParams,
    qwen2vl_tensor_names,
    read_qwen2vl_hparams,
)
from runtime.ggml.backend import UNLIMITED, Backend, DeviceType, alloc_tensors, make_cpu
from runtime.ggml.backend import Device as RuntimeDevice
from runtime.ggml.graph import BufferUsage, Graph, Op, Tensor
from runtime.ggml.profiles import Backend as BackendKind
from runtime.ggml.sched import Scheduler

CLIP_MAX_NODES = 8192        # clip_ctx::max_nodes, the scheduler's graph size
CACHE_SIZE = 32
# ggml-cuda/fattn.cu ggml_cuda_get_best_fattn_kernel: head sizes with a kernel when V's equals K's
CUDA_FA_HEAD_SIZES = frozenset({40, 64, 72, 80, 96, 112, 128, 256})


@dataclass(frozen=True)
class ProjectorReserve:
    """What clip.cpp allocates at load: its weights buffer and the warmup reserve's compute buffers."""

    device: str                   # the backend holding the weights: a device name, or CPU
    weight_bytes: int
    compute_bytes: Mapping[str, int]   # backend name (device names, CPU) -> compute buffer bytes
    n_nodes: int
    n_splits: int
    flash_attn: bool
    image_size: int               # the warmup image's side


def _backend(device: Device) -> Backend:
    profile = device.profile
    rt = RuntimeDevice(device.name, DeviceType.GPU, UNLIMITED, alignment=device.alignment,
                       offload_min_batch=profile.offload_min_batch(), profile=profile,
                       compute_capability=device.compute_capability)
    rt.ops = rt.ops | CLIP_SIZED_OPS | FAMILY_SIZED_OPS
    return rt.init_backend()


def _fa_supported(device: Device | None, d_head: int) -> bool:
    """Whether clip's backend takes the FLASH_ATTN_EXT node (reserve_compute_meta asks
    ggml_backend_supports_op). The CPU takes every head size; ggml-rpc's supports_op answers true
    without asking the server (ggml-rpc.cpp ggml_backend_rpc_device_supports_op); CUDA and ROCm have
    kernels for CUDA_FA_HEAD_SIZES when V's head equals K's (ggml-cuda/fattn.cu
    ggml_cuda_get_best_fattn_kernel). Other backends are taken to accept it (SigLIP's 72 is in
    Metal's list and a multiple of 8 for Vulkan; their further checks are not modelled)."""
    if device is not None and device.backend in (BackendKind.CUDA, BackendKind.ROCM):
        return d_head in CUDA_FA_HEAD_SIZES
    return True


def read_projector(model: ModelFile, image_max_tokens: int = -1) -> ClipHParams:
    """The projector's hparams, read by its family's reader (projector type -> graph builder)."""
    family = FAMILIES.get(projector_type(model))
    if family is not None:
        return family.read(model)
    if projector_type(model) in QWEN2VL_TYPES:
        return read_qwen2vl_hparams(model)
    if projector_type(model) == VisionProjectorType.PIXTRAL:
        return read_pixtral_hparams(model)
    return read_clip_hparams(model, image_max_tokens)


def _weights_and_graph(model: ModelFile, hp: ClipHParams, fa: bool) -> tuple[dict[str, Tensor], Graph]:
    family = FAMILIES.get(hp.projector)
    if family is not None:
        left = {t.name for t in model.tensors if family.left_in_file(t.name)}
        weights = load_weights(model, hp, [*family.names(hp), *left])
        weights = {n: t for n, t in weights.items() if n not in left}
        return weights, family.graph(hp, weights, fa).build()
    if isinstance(hp, QwenVLHParams):
        weights = load_weights(model, hp, qwen2vl_tensor_names(hp))
        builder = Qwen3VLGraph if hp.projector == VisionProjectorType.QWEN3VL else Qwen2VLGraph
        return weights, builder(hp, weights, fa).build()
    if hp.projector == VisionProjectorType.PIXTRAL:
        weights = load_weights(model, hp, pixtral_tensor_names(hp))
        return weights, PixtralGraph(hp, weights, fa).build()
    weights = load_weights(model, hp)
    return weights, SiglipGraph(hp, weights, fa).build()


# --- proja: projector families with a module of their own: type -> reader, tensor names, graph ------

class GraphBuilder(Protocol):
    def build(self) -> Graph: ...


@dataclass(frozen=True)
class ProjectorFamily:
    """How one projector type is read (load_hparams), which tensors it loads (load_tensors) and which
    builder makes its warmup graph (the clip_graph_* of clip.cpp's build_graph)."""

    read: Callable[[ModelFile], ClipHParams]
    names: Callable[[ClipHParams], list[str]]
    graph: Callable[[ClipHParams, Mapping[str, Tensor], bool], GraphBuilder]
    # tensors the type's files carry that clip.cpp leaves unloaded (they count in load_hparams' model
    # size, not in the weights buffer); any other tensor the loader does not ask for is refused
    left_in_file: Callable[[str], bool] = lambda _name: False


FAMILIES: dict[str, ProjectorFamily] = {
    VisionProjectorType.GEMMA4V: ProjectorFamily(read_gemma4_hparams, gemma4_tensor_names, Gemma4VGraph,
                                                 is_audio_tensor),
    GEMMA4UV: ProjectorFamily(read_gemma4_hparams, gemma4_tensor_names, Gemma4UVGraph, is_audio_tensor),
    GEMMA3NV: ProjectorFamily(read_mobilenet_hparams, mobilenet_tensor_names, MobileNetV5Graph,
                              gemma3n_left_in_file),
    LLAMA4: ProjectorFamily(read_llama4_hparams, llama4_tensor_names, Llama4Graph),
    GLM4V: ProjectorFamily(read_glm4v_hparams, glm4v_tensor_names, Glm4VGraph),
    GEMMA4A: ProjectorFamily(read_gemma4a_hparams, gemma4a_tensor_names, Gemma4AGraph),
    GEMMA4UA: ProjectorFamily(read_gemma4a_hparams, gemma4a_tensor_names, Gemma4UAGraph),
}


def _audio_half(model: ModelFile) -> str | None:
    """The audio projector type clip_init loads beside the vision one (a second clip_ctx), where it is one
    of Gemma 4's; None for a file with one encoder."""
    meta = model.metadata
    if not (meta.get(Keys.Clip.HAS_VISION_ENCODER) and meta.get(Keys.Clip.HAS_AUDIO_ENCODER)):
        return None
    audio = str(meta.get(Keys.ClipAudio.PROJECTOR_TYPE) or "")
    return audio if audio in (GEMMA4A, GEMMA4UA) and projector_type(model) in (GEMMA4V, GEMMA4UV) else None


def _plus_audio(vision: ProjectorReserve, model: ModelFile, audio: str, device: Device | None,
                flash_attn: str) -> ProjectorReserve:
    """clip_init's audio context after the vision one: its own weights buffer on the same backend and its
    own warmup reserve (Gemma 4's audio graphs have no attention node, so -fa auto stays enabled); the two
    contexts' buffers add up, as do their graphs' nodes and splits."""
    hp = read_gemma4a_hparams(model, audio)
    family = FAMILIES[audio]
    vision_tensors = [t.name for t in model.tensors if not is_audio_tensor(t.name)]
    weights = {n: t for n, t in load_weights(model, hp, [*family.names(hp), *vision_tensors]).items()
               if is_audio_tensor(n)}
    graph = family.graph(hp, weights, flash_attn == "on").build()
    cpu = make_cpu(UNLIMITED)
    cpu.device.ops = cpu.device.ops | CLIP_SIZED_OPS | FAMILY_SIZED_OPS
    main = _backend(device) if device is not None else cpu
    backends = [main, cpu] if main is not cpu else [cpu]
    buffers = alloc_tensors(main.buffer_type, list(weights.values()), BufferUsage.WEIGHTS)
    sched = Scheduler(backends, parallel=False, op_offload=True)
    sched.reserve(graph)
    compute = dict(vision.compute_bytes)
    for b in backends:
        compute[b.name] = compute.get(b.name, 0) + sched.buffer_size(b)
    return replace(vision, weight_bytes=vision.weight_bytes + sum(b.size for b in buffers), compute_bytes=compute,
                   n_nodes=vision.n_nodes + len(graph.nodes), n_splits=vision.n_splits + sched.n_splits)


# ops these graphs use that have no numpy kernel (sizes only, as CLIP_SIZED_OPS)
FAMILY_SIZED_OPS = frozenset({Op.SUB, Op.CONV_2D, Op.PAD, Op.SSM_CONV})


_cache: OrderedDict[tuple, ProjectorReserve] = OrderedDict()


def reserve_projector(model: ModelFile, device: Device | None, flash_attn: str = "auto",
                      image_max_tokens: int = -1) -> ProjectorReserve:
    """The projector loaded on `device` (None: the CPU alone) with -fa `flash_attn` (auto/on/off)
    and --image-max-tokens (-1: the model's)."""
    key = (model.path, model.header_bytes, device, flash_attn, image_max_tokens)
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        return hit
    hp = read_projector(model, image_max_tokens)
    # -fa on keeps flash attention even where refused (the op then falls back to the CPU: not modelled)
    # a graph without attention (no heads: Gemma 4's unified embedder) never refuses it
    fa = flash_attn == "on" or (flash_attn == "auto"
                                and (hp.n_head == 0 or _fa_supported(device, hp.n_embd // hp.n_head)))
    cpu = make_cpu(UNLIMITED)
    cpu.device.ops = cpu.device.ops | CLIP_SIZED_OPS | FAMILY_SIZED_OPS
    main = _backend(device) if device is not None else cpu
    backends = [main, cpu] if main is not cpu else [cpu]
    try:
        weights, graph = _weights_and_graph(model, hp, fa)
    except ValueError as e:   # an operand shape the pinned clip.cpp would assert on
        raise BadInput(f"{model.path}: the {hp.projector} projector's tensors do not fit its graph: {e}") from None
    buffers = alloc_tensors(main.buffer_type, list(weights.values()), BufferUsage.WEIGHTS)
    sched = Scheduler(backends, parallel=False, op_offload=True)
    if len(graph.nodes) > CLIP_MAX_NODES:
        raise BadInput(f"{model.path}: the projector graph has {len(graph.nodes)} nodes, over clip's {CLIP_MAX_NODES}")
    sched.reserve(graph)
    n_splits = sched.n_splits
    compute = {b.name: sched.buffer_size(b) for b in backends}
    out = ProjectorReserve(main.name if main is not cpu else CPU, sum(b.size for b in buffers),
                           compute, len(graph.nodes), n_splits, fa, hp.warmup_image_size)
    audio = _audio_half(model)     # proja: a Gemma 4 file with both encoders loads a second context
    if audio is not None:
        out = _plus_audio(out, model, audio, device, flash_attn)
    _cache[key] = out
    if len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return out
