"""Component sizes of a stable-diffusion.cpp model, from file headers only.

A model is one or more files: a full checkpoint (`-m`, tensors classified by name) and/or one
file per module (`--diffusion-model`, `--vae`, `--t5xxl`, ...). stable-diffusion.cpp's
auto-fit sums, per component, every used tensor's loaded size plus 64 bytes, and keeps the
largest such tensor as staging room (src/core/backend_fit.cpp, `estimate_components`).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from pathlib import Path

from planner.core.errors import BadInput
from planner.core.units import GiB
from planner.gguf.location import open_source
from planner.gguf.reader import TensorInfo, read_model
from planner.gguf.source import is_url
from planner.sd.assign import Module
from planner.sd.roles import Kind, ModelSource
from planner.sd.safetensors_header import read_safetensors

# backend_fit.cpp adds this much to every tensor when estimating a component.
SIMULATED, CURVE = "simulated", "sd-cli curve"   # Component.compute_origin
# Component.compute_origin of a runner whose device refuses a node of its graph (a Vulkan tensor over the storage
# buffer range): sd-cli reserves it with a scheduler that computes those nodes on the CPU (ggml_extend.hpp
# GGMLRunner::alloc_compute_buffer, graph_requires_backend_fallback), whose buffers are not modelled
FALLBACK = "CPU fallback"
TENSOR_OVERHEAD_BYTES = 64
# The params buffer sd-cli allocates ("total params memory size" in its log): each tensor's
# ggml size padded to the CPU buffer's 32-byte alignment, in the type the model code creates it
# with: 1-D tensors (biases, norms), CLIP's position embedding and OpenCLIP's text projection
# F32 and every convolution
# kernel (4-D) F16 whatever the file stores (src/core/ggml_extend.hpp Conv2d / Conv3d,
# src/model/te/clip.hpp CLIPEmbeddings), every other weight in the file's type. A standalone
# CLIP-L file's text_projection is not created (sd.cpp's CLIP-L has no projection), nor SD 2.x's
# OpenCLIP-H one (src/model/te/clip.hpp creates text_projection for bigG only).
BUFFER_ALIGNMENT = 32
F32_BYTES = 4
F16_BYTES = 2
_F32_NAMES = ("position_embedding", "positional_embedding", "text_projection")
_NOT_CREATED = ("clip_l.text_projection.weight", "cond_stage_model.model.text_projection")
# Wan: a DiT block's and the head's `modulation` (src/model/diffusion/wan.hpp: typed from a
# "<block>.weight" the file never has, so F32) and the VAE's RMS-norm `gamma`s, shaped (C, 1, 1, 1)
# in the file (src/model/vae/wan_vae.hpp RMS_norm: F32 in the file's shape); its 5-D causal 3-D
# convolution kernels are F16 like the 4-D ones (CausalConv3d, Conv3d).
# LTX-2: every timestep embedder's two linear layers (src/model/diffusion/ltxv.hpp TimestepEmbedder:
# Linear with force_f32), the DiT's AdaLN ones and the video VAE's alike.
_F32_SUFFIXES = (".modulation", ".gamma", ".timestep_embedder.linear_1.weight", ".timestep_embedder.linear_2.weight")


KIND_MODULE: dict[Kind, Module] = {Kind.DIFFUSION: Module.DIFFUSION, Kind.TE: Module.TE, Kind.VAE: Module.VAE}
KIND_LABEL: dict[Kind, str] = {Kind.DIFFUSION: "DiT", Kind.TE: "Conditioner", Kind.VAE: "VAE"}
# Seed 002: "Initial compute reserves are estimates (2 GiB for diffusion and text encoders, 1 GiB for VAE)".
COMPUTE_RESERVE: dict[Kind, int] = {Kind.DIFFUSION: 2 * GiB, Kind.TE: 2 * GiB, Kind.VAE: 1 * GiB}


class Match(enum.Enum):
    CONTAINS = "contains"
    PREFIX = "prefix"


# Tensor-name rules of backend_fit.cpp `classify_tensor`, tried in this order.
CLASSIFY_RULES: tuple[tuple[Kind, Match, str], ...] = (
    (Kind.DIFFUSION, Match.CONTAINS, "model.diffusion_model."),
    (Kind.DIFFUSION, Match.CONTAINS, "unet."),
    (Kind.VAE, Match.CONTAINS, "first_stage_model."),
    (Kind.VAE, Match.PREFIX, "vae."),
    (Kind.VAE, Match.PREFIX, "tae."),
    (Kind.TE, Match.CONTAINS, "text_encoders"),
    (Kind.TE, Match.CONTAINS, "cond_stage_model"),
    (Kind.TE, Match.CONTAINS, "te.text_model."),
    (Kind.TE, Match.CONTAINS, "conditioner"),
    (Kind.TE, Match.PREFIX, "text_encoder."),
    (Kind.TE, Match.PREFIX, "text_embedding_projection."),
    (Kind.TE, Match.CONTAINS, ".aggregate_embed."),
)

# Tensors sd.cpp never loads (src/model_loader.cpp `unused_tensors`, a prefix list; the
# training-only and scheduler buffers that appear in real checkpoints).
UNUSED_PREFIXES: tuple[str, ...] = (
    "betas", "alphas_cumprod", "alphas_cumprod_prev", "sqrt_alphas_cumprod",
    "sqrt_one_minus_alphas_cumprod", "log_one_minus_alphas_cumprod", "sqrt_recip_alphas_cumprod",
    "sqrt_recipm1_alphas_cumprod", "posterior_variance", "posterior_log_variance_clipped",
    "posterior_mean_coef1", "posterior_mean_coef2",
    "cond_stage_model.transformer.text_model.embeddings.position_ids",
    "cond_stage_model.1.model.text_model.embeddings.position_ids",
    "cond_stage_model.transformer.vision_model.embeddings.position_ids",
    "cond_stage_model.model.logit_scale",
    "conditioner.embedders.0.transformer.text_model.embeddings.position_ids",
    "conditioner.embedders.0.model.logit_scale", "conditioner.embedders.1.model.logit_scale",
    "model.diffusion_model.time_embedding.cond_proj.weight", "unet.time_embedding.cond_proj.weight",
    "model_ema.decay", "model_ema.num_updates", "model_ema.diffusion_model", "embedding_manager",
    "denoiser.sigmas", "text_encoders.t5xxl.transformer.encoder.embed_tokens.weight", "ztsnr",
    "edm_vpred.sigma_min", "text_encoders.llm.output.weight", "text_encoders.llm.lm_head.",
)


@dataclass(frozen=True)
class SdTensor:
    name: str  # with the file role's prefix
    n_bytes: int  # loaded size plus TENSOR_OVERHEAD_BYTES
    buffer_bytes: int = 0  # its share of sd-cli's params buffer (see BUFFER_ALIGNMENT)
    n_dims: int = 2        # 1: a norm scale or a bias, which a row split leaves unsplit


@dataclass(frozen=True)
class Component:
    kind: Kind
    params_bytes: int
    largest_tensor_bytes: int
    tensors: tuple[SdTensor, ...] = field(default=(), repr=False)
    # The compute buffer sd-cli reserves at the planned image size and modes (planner/sd/sizing.py);
    # None: unknown model, seed 002's fixed reserve stands in.
    compute_bytes: int | None = None
    compute_mode: str = ""   # "fa=on,conv_direct=off" (+ ",tiled") where compute_bytes is known
    # where compute_bytes comes from: SIMULATED (runtime/sd reserves the runner's graph) or CURVE (a curve
    # through sd-cli's recorded figures, planner/sd/sd_compute.py); "" with compute_mode, or FALLBACK (no figure:
    # the compute device refuses a node of a runner's graph)
    compute_origin: str = ""

    @property
    def buffer_bytes(self) -> int:
        """The params buffer sd-cli allocates for this component."""
        return sum(t.buffer_bytes for t in self.tensors)

    @property
    def reserve_bytes(self) -> int:
        return COMPUTE_RESERVE[self.kind] if self.compute_bytes is None else self.compute_bytes


def classify(name: str) -> Kind | None:
    """The component a checkpoint tensor belongs to, or None (sd.cpp's auto-fit ignores it)."""
    for kind, match, pattern in CLASSIFY_RULES:
        if (pattern in name) if match is Match.CONTAINS else name.startswith(pattern):
            return kind
    return None


def is_unused(name: str) -> bool:
    return name.startswith(UNUSED_PREFIXES)


def _is_gguf(path: str) -> bool:
    """By the magic for a local file; a URL by its name (sniffing it would cost a request)."""
    if is_url(path):
        return not path.split("?")[0].lower().endswith(".safetensors")
    with open_source(path) as source:
        return bytes(source.prefix(4)[:4]) == b"GGUF"


def _padded(n: int) -> int:
    return -(-n // BUFFER_ALIGNMENT) * BUFFER_ALIGNMENT


def _buffer_bytes(name: str, shape: tuple[int, ...], n_bytes: int) -> int:
    n_elements = 1
    for d in shape:
        n_elements *= d
    if len(shape) <= 1 or any(f in name for f in _F32_NAMES) or name.endswith(_F32_SUFFIXES):
        return _padded(n_elements * F32_BYTES)
    if len(shape) >= 4:
        return _padded(n_elements * F16_BYTES)
    return _padded(n_bytes)


# Weights a model's code creates F32 whatever the file stores, by the model's marker tensor (a
# name fragment only that model has): SD3's MMDiT makes its position table F32 and its
# embedders' and final layer's Linears with force_f32 (src/model/diffusion/mmdit.hpp), Z-Image
# its timestep embedder and final linear (z_image.hpp, with mmdit.hpp's TimestepEmbedder).
FORCED_F32: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("joint_blocks.", ("pos_embed", "t_embedder.mlp.0.weight", "t_embedder.mlp.2.weight", "y_embedder.mlp.0.weight",
                       "y_embedder.mlp.2.weight", "context_embedder.weight", "final_layer.linear.weight")),
    ("cap_embedder.", ("t_embedder.mlp.0.weight", "t_embedder.mlp.2.weight", "final_layer.linear.weight")),
)


def _forced_f32(names: list[str]) -> tuple[str, ...]:
    """The name suffixes created F32 in a file with these tensor names."""
    return tuple(suffix for marker, suffixes in FORCED_F32 if any(marker in n for n in names) for suffix in suffixes)


def _file_tensors(path: str) -> list[tuple[str, int, int, int]]:
    """(name, loaded bytes, params-buffer bytes, dimensions) of every tensor in the file."""
    tensors = _gguf_tensors(path) if _is_gguf(path) else read_safetensors(path)
    forced = _forced_f32([t.name for t in tensors])
    return [(t.name, t.n_bytes, _padded(math.prod(t.shape) * F32_BYTES) if forced and t.name.endswith(forced)
             else _buffer_bytes(t.name, t.shape, t.n_bytes), _n_dims(t.shape)) for t in tensors]


def _n_dims(shape: tuple[int, ...]) -> int:
    """Dimensions past trailing ones (GGUF pads none; a safetensors [n, 1] is still a matrix)."""
    return max(len(shape), 1)


def _gguf_tensors(path: str) -> tuple[TensorInfo, ...]:
    """GGUF tensors. stable-diffusion.cpp's own converter writes no metadata at all
    (src/model_io/gguf_io.cpp), so a missing general.architecture — which read_model requires
    for llama.cpp models — is not an error here."""
    return read_model(path, require_architecture=False).tensors


def _source_tensors(source: ModelSource) -> list[tuple[Kind, SdTensor]]:
    out = []
    for raw_name, n_bytes, buffer_bytes, n_dims in _file_tensors(source.path):
        name = source.role.prefix + raw_name
        kind = source.role.kind if source.role.kind is not None else classify(name)
        if kind is None or is_unused(name):
            continue
        created = not name.endswith(_NOT_CREATED)
        out.append((kind, SdTensor(name, n_bytes + TENSOR_OVERHEAD_BYTES, buffer_bytes if created else 0, n_dims)))
    return out


def read_components(sources: list[ModelSource]) -> tuple[Component, ...]:
    """Diffusion, TE and VAE components (in that order; absent ones have 0 bytes)."""
    if not sources:
        raise BadInput("no model file given")
    by_kind: dict[Kind, list[SdTensor]] = {k: [] for k in Kind}
    for source in sources:
        if not is_url(source.path) and not Path(source.path).is_file():
            raise BadInput(f"{source.path}: no such model file")
        for kind, tensor in _source_tensors(source):
            by_kind[kind].append(tensor)
    if not any(by_kind.values()):
        names = ", ".join(s.path for s in sources)
        raise BadInput(f"{names}: no diffusion, text-encoder or VAE tensors found")
    return tuple(Component(kind, sum(t.n_bytes for t in ts), max((t.n_bytes for t in ts), default=0), tuple(ts))
                 for kind, ts in by_kind.items())
