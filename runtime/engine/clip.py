"""The multimodal projector (tools/mtmd) sized as clip.cpp sizes it: its weights buffer and the
compute buffer of its warmup graph, reserved through the runtime's scheduler and allocator.

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd):
- clip.cpp clip_ctx::clip_ctx: the projector runs on one backend plus the CPU (`use_gpu` with a
  `device`, else the first GPU-type device, else the first iGPU, else the CPU alone), in a scheduler
  made with parallel=false and op_offload=true.
- clip.cpp clip_model_loader::load_tensors: every tensor the loader asks for goes into one buffer of
  that backend's default buffer type (ggml_backend_alloc_ctx_tensors_from_buft), usage WEIGHTS.
- clip.cpp get_dummy_batch / warmup / reserve_compute_meta: the warmup image is
  hparams.warmup_image_size square (Gemma 3: image_size, load_hparams); with flash attention
  `auto` the graph is reserved with it enabled, and again with it disabled only when the backend
  refuses the FLASH_ATTN_EXT node (the allocator's buffers only grow, so the larger reserve stays).
- clip.cpp build_inp / build_vit / build_norm / build_attn / build_ffn / build_patch_merge_permute
  and models/siglip.cpp clip_graph_siglip::build (PROJECTOR_TYPE_GEMMA3 and PROJECTOR_TYPE_IDEFICS3):
  the graph below, node for node (865 nodes for Gemma 3's 27-layer SigLIP-So400m tower, as llama.cpp
  logs). Both keep load_hparams' default warmup size, image_size (IDEFICS3's set_limit_image_tokens()
  only moves the preprocessor's pixel limits).

Only sizes are simulated: IM2COL, POOL_2D and NORM have no numpy kernel, so the devices declare
them (CLIP_SIZED_OPS) for the scheduler and no graph here is ever computed.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from gguf import MODEL_TENSOR, TENSOR_NAMES, Keys, VisionProjectorType

from planner.core.errors import BadInput
from planner.gguf.reader import ModelFile
from planner.llama.placement import CPU, Device
from runtime.ggml import build as g
from runtime.ggml.backend import UNLIMITED, Backend, DeviceType, alloc_tensors, make_cpu
from runtime.ggml.backend import Device as RuntimeDevice
from runtime.ggml.graph import BufferUsage, GGMLType, Graph, Op, Tensor, TensorFlag
from runtime.ggml.profiles import Backend as BackendKind
from runtime.ggml.sched import Scheduler

T = MODEL_TENSOR
CV = Keys.ClipVision
CLIP_SIZED_OPS = frozenset({Op.IM2COL, Op.POOL_2D, Op.NORM})
GEMMA3_N_MERGE = 4           # clip.cpp load_hparams: Gemma 3 pools 4x4 patches unless the file says otherwise
CLIP_MAX_NODES = 8192        # clip_ctx::max_nodes, the scheduler's graph size
CACHE_SIZE = 32
CUDA_FA_HEAD_SIZES = frozenset({40, 64, 72, 80, 96, 112, 128, 256})


class UnsupportedProjector(BadInput):
    """A projector type (clip.projector_type) fitplan has no graph builder for."""

    code = "unsupported_projector"

    def __init__(self, path: str, projector: str) -> None:
        self.path, self.projector = path, projector
        super().__init__(f"{path}: projector type {projector!r} is not modelled; fitplan sizes "
                         f"{' and '.join(repr(p) for p in HEADS)} projectors only")


@dataclass(frozen=True)
class ClipHParams:
    """clip.cpp load_hparams' figures for a vision projector."""

    projector: str
    n_embd: int
    n_head: int
    n_ff: int
    n_layer: int
    eps: float
    image_size: int
    patch_size: int
    n_merge: int
    ffn_op: str           # ggml unary of the FFN: GELU (clip.use_gelu), SILU (clip.use_silu), else GELU_QUICK
    n_mmproj_embd: int    # clip_n_mmproj_embd: the projection's output width, the text model's

    @property
    def warmup_image_size(self) -> int:
        return self.image_size   # load_hparams' default warmup_image_size; Gemma 3 and IDEFICS3 keep it

    @property
    def n_patches_side(self) -> int:
        return self.warmup_image_size // self.patch_size


def name(kind: MODEL_TENSOR, bid: int | None = None, suffix: str | None = "weight") -> str:
    base = TENSOR_NAMES[kind].format(bid=bid)
    return f"{base}.{suffix}" if suffix else base


def projector_type(model: ModelFile) -> str:
    """clip.projector_type, or clip.vision.projector_type for mixed-modality files (load_hparams)."""
    return str(model.metadata.get(Keys.Clip.PROJECTOR_TYPE) or model.metadata.get(CV.PROJECTOR_TYPE) or "")


@dataclass(frozen=True)
class SiglipHead:
    """What a siglip.cpp projector type adds after the ViT: its mm.* tensors (clip.cpp load_tensors),
    the tensor and dimension clip_n_mmproj_embd reads the output width from, load_hparams' n_merge."""

    tensors: tuple[str, ...]
    width_tensor: str
    width_dim: int
    default_merge: int


HEADS: dict[str, SiglipHead] = {
    VisionProjectorType.GEMMA3: SiglipHead((name(T.V_MM_INP_PROJ), name(T.V_MM_SOFT_EMB_NORM)),
                                           name(T.V_MM_INP_PROJ), 0, GEMMA3_N_MERGE),
    VisionProjectorType.IDEFICS3: SiglipHead((name(T.V_MMPROJ_FC),), name(T.V_MMPROJ_FC), 1, 1),
}


def read_clip_hparams(model: ModelFile) -> ClipHParams:
    """The vision hparams of a Gemma 3 or IDEFICS3 projector file; other projector types are refused."""
    meta = model.metadata
    proj = projector_type(model)
    head = HEADS.get(proj)
    if head is None or not meta.get(Keys.Clip.HAS_VISION_ENCODER):
        raise UnsupportedProjector(model.path, proj or "(none)")
    width = model.tensor(head.width_tensor)
    if width is None:
        raise BadInput(f"{model.path}: a {proj} projector without {head.width_tensor}")
    try:
        ffn_op = "GELU" if meta.get(CV.USE_GELU) else "SILU" if meta.get(CV.USE_SILU) else "GELU_QUICK"
        hp = ClipHParams(proj, int(meta[CV.EMBEDDING_LENGTH]), int(meta[CV.Attention.HEAD_COUNT]),
                         int(meta[CV.FEED_FORWARD_LENGTH]), int(meta[CV.BLOCK_COUNT]),
                         float(meta[CV.Attention.LAYERNORM_EPS]), int(meta[CV.IMAGE_SIZE]),
                         int(meta[CV.PATCH_SIZE]), int(meta.get(CV.Projector.SCALE_FACTOR, head.default_merge)),
                         ffn_op, width.shape[head.width_dim])
    except KeyError as e:
        raise BadInput(f"{model.path}: projector key {e.args[0]} not found") from None
    if hp.n_merge < 2 or hp.n_patches_side % hp.n_merge:
        # build_patch_merge_permute asserts a factor > 1 and pads a side it does not divide (ggml_pad:
        # not modelled); Gemma 3's pool needs the factor to divide the side as well
        raise UnsupportedProjector(model.path, f"{proj} merging {hp.n_merge}x{hp.n_merge} of "
                                               f"{hp.n_patches_side}x{hp.n_patches_side} patches")
    return hp


# --- the tensors clip.cpp load_tensors asks for (the generic vision set plus the head's mm.*) ------

_LAYER_TENSORS = (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V, T.V_ENC_ATTN_O, T.V_ENC_INPUT_NORM,
                  T.V_ENC_POST_ATTN_NORM, T.V_ENC_FFN_UP, T.V_ENC_FFN_DOWN)
_MODEL_TENSORS = (T.V_ENC_EMBD_PATCH, T.V_ENC_EMBD_POS, T.V_POST_NORM)


def tensor_names(hp: ClipHParams) -> list[str]:
    """Every name the graph reads, weights and biases, in load order."""
    names = [name(k, None, s) for k in _MODEL_TENSORS for s in ("weight", "bias")]
    names += [name(k, il, s) for il in range(hp.n_layer) for k in _LAYER_TENSORS for s in ("weight", "bias")]
    return names + list(HEADS[hp.projector].tensors)


def load_weights(model: ModelFile, hp: ClipHParams) -> dict[str, Tensor]:
    """The projector's weights as clip.cpp loads them (absent optional biases stay absent); a tensor
    the graph does not read (a layer scale, a pre-norm) is refused rather than ignored."""
    known = set(tensor_names(hp))
    extra = [t.name for t in model.tensors if t.name not in known]
    if extra:
        raise UnsupportedProjector(model.path, f"{hp.projector} with {extra[0]}")
    return {t.name: Tensor(t.ggml_type, t.shape, name=t.name) for t in model.tensors}


# --- the graph (clip.cpp build_* and models/siglip.cpp) ---------------------------------------------

class SiglipGraph:
    """clip_graph_siglip::build at the warmup image size (Gemma 3 or IDEFICS3 head)."""

    def __init__(self, hp: ClipHParams, w: Mapping[str, Tensor], flash_attn: bool) -> None:
        self.hp, self.w, self.flash_attn = hp, w, flash_attn
        self.graph = Graph()

    def _opt(self, n: str) -> Tensor | None:
        return self.w.get(n)

    def norm(self, x: Tensor, kind: MODEL_TENSOR, il: int | None = None) -> Tensor:
        """build_norm, NORM_TYPE_NORMAL: layer norm, times the weight, plus the bias."""
        x = Tensor(x.type, x.ne, op=Op.NORM, src=[x], op_params={"eps": self.hp.eps})
        wt, b = self._opt(name(kind, il)), self._opt(name(kind, il, "bias"))
        x = g.mul(x, wt) if wt is not None else x
        return g.add(x, b) if b is not None else x

    def linear(self, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        x = g.mul_mat(w, x)
        return g.add(x, b) if b is not None else x

    def inp(self) -> Tensor:
        """build_inp_raw and build_inp: a stride-patch conv2d (ggml_conv_2d: im2col, then a matmul)."""
        hp, side = self.hp, self.hp.warmup_image_size
        raw = g.new_tensor(GGMLType.F32, (side, side, 3, 1), "inp_raw", TensorFlag.INPUT)
        kernel = self.w[name(T.V_ENC_EMBD_PATCH)]
        oside = self.hp.n_patches_side
        col_type = GGMLType.F32 if kernel.type == GGMLType.BF16 else GGMLType.F16   # ggml_conv_2d
        k0, k1, ic, oc = kernel.ne
        col = Tensor(col_type, (ic * k1 * k0, oside, oside, 1), op=Op.IM2COL, src=[kernel, raw])
        y = g.mul_mat(g.reshape(col, (col.ne[0], oside * oside)), g.reshape(kernel, (k0 * k1 * ic, oc)))
        y = g.reshape(y, (oside, oside, 1, oc))
        y = g.cont(g.permute(y, (0, 1, 3, 2)))
        y = g.reshape(y, (oside * oside, hp.n_embd, 1))
        y = g.cont(g.transpose(y))
        bias = self._opt(name(T.V_ENC_EMBD_PATCH, None, "bias"))
        return g.add(y, bias) if bias is not None else y

    def attention(self, x: Tensor, il: int) -> Tensor:
        """build_vit's separate q/k/v projections and build_attn (flash or soft_max path)."""
        hp, n_pos = self.hp, self.hp.n_patches_side ** 2
        d_head = hp.n_embd // hp.n_head
        qkv = []
        for kind in (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V):
            t = self.linear(x, self.w[name(kind, il)], self._opt(name(kind, il, "bias")))
            t = g.reshape(t, (d_head, hp.n_head, n_pos, 1))
            self.graph.expand(t)    # ggml_build_forward_order: q, k, v enter the graph in this order
            qkv.append(t)
        q = g.permute(qkv[0], (0, 2, 1, 3))
        k = g.permute(qkv[1], (0, 2, 1, 3))
        scale = d_head ** -0.5
        if self.flash_attn:
            v = g.permute(qkv[2], (0, 2, 1, 3))
            k16, v16 = _cast(k, GGMLType.F16), _cast(v, GGMLType.F16)
            out = g.flash_attn_ext(q, k16, v16, None, scale)
            out = g.reshape(out, (out.ne[0] * out.ne[1], out.ne[2] * out.ne[3]))
        else:
            v = g.cont(g.permute(qkv[2], (1, 2, 0, 3)))
            kq = g.soft_max_ext(g.mul_mat(k, q), None, scale)
            kqv = g.permute(g.mul_mat(v, kq), (0, 2, 1, 3))
            out = g.cont(kqv, (kqv.ne[0] * kqv.ne[1], kqv.ne[2] * kqv.ne[3]))
        return self.linear(out, self.w[name(T.V_ENC_ATTN_O, il)], self._opt(name(T.V_ENC_ATTN_O, il, "bias")))

    def ffn(self, x: Tensor, il: int) -> Tensor:
        """build_ffn without a gate; up/down swapped back when stored as the converter names them."""
        up, down = self.w[name(T.V_ENC_FFN_UP, il)], self.w[name(T.V_ENC_FFN_DOWN, il)]
        up_b, down_b = self._opt(name(T.V_ENC_FFN_UP, il, "bias")), self._opt(name(T.V_ENC_FFN_DOWN, il, "bias"))
        if down.ne[0] == self.hp.n_embd:     # clip.cpp load_tensors: is_ffn_swapped (Gemma 3 among them)
            up, down, up_b, down_b = down, up, down_b, up_b
        y = g.unary(self.linear(x, up, up_b), self.hp.ffn_op)
        return self.linear(y, down, down_b)

    def vit(self, x: Tensor) -> Tensor:
        """build_vit: learned positions, the pre-norm layers, the post layer norm."""
        hp, n_pos = self.hp, self.hp.n_patches_side ** 2
        x = g.add(x, self.w[name(T.V_ENC_EMBD_POS)])
        x = g.reshape(x, (hp.n_embd, n_pos))
        for il in range(hp.n_layer):
            y = self.attention(self.norm(x, T.V_ENC_INPUT_NORM, il), il)
            x = g.add(y, x)
            y = self.ffn(self.norm(x, T.V_ENC_POST_ATTN_NORM, il), il)
            x = g.add(x, y)
        if self._opt(name(T.V_POST_NORM)) is not None:
            x = self.norm(x, T.V_POST_NORM)
        return g.reshape(x, (hp.n_embd, n_pos, 1))

    def gemma3(self, x: Tensor) -> Tensor:
        """siglip.cpp's Gemma 3 branch: average-pool n_merge x n_merge patches, RMS norm, project."""
        hp, side = self.hp, self.hp.n_patches_side
        x = g.cont(g.transpose(x), (side, side, hp.n_embd, 1))
        pooled = side // hp.n_merge        # ggml_calc_pool_output_size with stride = kernel, no padding
        x = Tensor(GGMLType.F32, (pooled, pooled, hp.n_embd, 1), op=Op.POOL_2D, src=[x],
                   op_params={"k": hp.n_merge, "s": hp.n_merge})
        x = g.reshape(x, (pooled * pooled, hp.n_embd, 1))
        x = g.cont(g.transpose(x))
        x = g.mul(g.rms_norm(x, hp.eps), self.w[name(T.V_MM_SOFT_EMB_NORM)])
        proj = g.cont(g.transpose(self.w[name(T.V_MM_INP_PROJ)]))
        return g.mul_mat(proj, x)

    def idefics3(self, x: Tensor) -> Tensor:
        """siglip.cpp's IDEFICS3 branch: build_patch_merge_permute (pixel unshuffle by n_merge on
        each side; the side divides, so no ggml_pad), then mm.model.fc."""
        hp, side, s = self.hp, self.hp.n_patches_side, self.hp.n_merge
        x = g.reshape(x, (hp.n_embd, side, side))
        x = g.permute(g.reshape(x, (hp.n_embd * s, side // s, side)), (0, 2, 1, 3))
        x = g.permute(g.cont(x, (hp.n_embd * s * s, side // s, side // s)), (0, 2, 1, 3))
        x = g.cont(x, (x.ne[0], x.ne[1] * x.ne[2]))
        return g.mul_mat(self.w[name(T.V_MMPROJ_FC)], x)

    def build(self) -> Graph:
        head = self.gemma3 if self.hp.projector == VisionProjectorType.GEMMA3 else self.idefics3
        self.graph.expand(head(self.vit(self.inp())))
        return self.graph


def _cast(a: Tensor, ggml_type: GGMLType) -> Tensor:
    """ggml_cast: a CPY into a new tensor of `ggml_type`. ggml makes the result its own src[1]; the
    allocator's child count then nets out the same, so the self-reference is left out here."""
    return Tensor(ggml_type, a.ne, name=f"{a.name} (copy)", op=Op.CPY, src=[a])


# --- the reserve -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProjectorReserve:
    """What clip.cpp allocates at load: its weights buffer and the warmup reserve's compute buffers."""

    device: str                   # the backend holding the weights: a device name, or CPU
    weight_bytes: int
    compute_bytes: Mapping[str, int]   # backend name (device names, CPU) -> compute buffer bytes
    n_nodes: int
    n_splits: int
    flash_attn: bool


def _backend(device: Device) -> Backend:
    profile = device.profile
    rt = RuntimeDevice(device.name, DeviceType.GPU, UNLIMITED, alignment=device.alignment,
                       offload_min_batch=profile.offload_min_batch(), profile=profile,
                       compute_capability=device.compute_capability)
    rt.ops = rt.ops | CLIP_SIZED_OPS
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


_cache: OrderedDict[tuple, ProjectorReserve] = OrderedDict()


def reserve_projector(model: ModelFile, device: Device | None, flash_attn: str = "auto") -> ProjectorReserve:
    """The projector loaded on `device` (None: the CPU alone) with -fa `flash_attn` (auto/on/off)."""
    key = (model.path, model.header_bytes, device, flash_attn)
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        return hit
    hp = read_clip_hparams(model)
    # -fa on keeps flash attention even where refused (the op then falls back to the CPU: not modelled)
    fa = flash_attn == "on" or (flash_attn == "auto" and _fa_supported(device, hp.n_embd // hp.n_head))
    cpu = make_cpu(UNLIMITED)
    cpu.device.ops = cpu.device.ops | CLIP_SIZED_OPS
    main = _backend(device) if device is not None else cpu
    backends = [main, cpu] if main is not cpu else [cpu]
    weights = load_weights(model, hp)
    buffers = alloc_tensors(main.buffer_type, list(weights.values()), BufferUsage.WEIGHTS)
    sched = Scheduler(backends, parallel=False, op_offload=True)
    graph = SiglipGraph(hp, weights, fa).build()
    if len(graph.nodes) > CLIP_MAX_NODES:
        raise BadInput(f"{model.path}: the projector graph has {len(graph.nodes)} nodes, over clip's {CLIP_MAX_NODES}")
    sched.reserve(graph)
    n_splits = sched.n_splits
    compute = {b.name: sched.buffer_size(b) for b in backends}
    out = ProjectorReserve(main.name if main is not cpu else CPU, sum(b.size for b in buffers),
                           compute, len(graph.nodes), n_splits, fa)
    _cache[key] = out
    if len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return out
