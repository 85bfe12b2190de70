"""The multimodal projector's hparams and weights (tools/mtmd), as clip.cpp reads them: the clip.*
keys, the warmup image size, the tensors the loader asks for; runtime/engine/clip.py builds the graphs.

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd):
- clip.cpp load_hparams: clip.* keys; the warmup image is image_size square unless the type sets
  token limits (clip-model.h set_limit_image_tokens: LFM2's 64..256 tokens, --image-max-tokens
  replacing the maximum) or a warmup token count (set_warmup_n_tokens: Phi-4's 16 x 16).
- clip.cpp load_tensors: the generic vision tensors plus each type's mm.* (HEADS); is_ffn_swapped.
- clip.cpp clip_n_mmproj_embd: the projection's output width, per type.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypedDict

from gguf import MODEL_TENSOR, TENSOR_NAMES, Keys, VisionProjectorType

from planner.core.errors import BadInput
from planner.gguf.reader import ModelFile, TensorInfo
from runtime.ggml.graph import Tensor

T = MODEL_TENSOR
CV = Keys.ClipVision
CA = Keys.ClipAudio
P = VisionProjectorType
WARMUP_AUDIO_FRAMES = 3000   # clip-model.h warmup_audio_size: the audio encoders' warmup clip
GEMMA3_N_MERGE = 4           # clip.cpp load_hparams: Gemma 3 pools 4x4 patches unless the file says otherwise


class UnsupportedProjector(BadInput):
    """A projector type (clip.projector_type) fitplan has no graph builder for."""

    code = "unsupported_projector"

    def __init__(self, path: str, projector: str) -> None:
        self.path, self.projector = path, projector
        super().__init__(f"{path}: projector type {projector!r} is not modelled; fitplan sizes "
                         f"{', '.join(repr(p) for p in SUPPORTED)} projectors only")


@contextmanager
def reading_keys(model: ModelFile) -> Iterator[None]:
    """Around a reader's look-ups of the keys load_hparams requires: a missing one is the file's error, named."""
    try:
        yield
    except KeyError as e:
        raise BadInput(f"{model.path}: projector key {e.args[0]} not found") from None


def required_tensor(model: ModelFile, projector: str, tensor: str) -> TensorInfo:
    """A tensor the reader takes a figure from (the projection's width): a file without it is refused."""
    info = model.tensor(tensor)
    if info is None:
        raise BadInput(f"{model.path}: a {projector} projector without {tensor}")
    return info


class TowerFigures(TypedDict):
    """The encoder's sizes every projector's load_hparams reads alike (ClipHParams' fields of that name)."""

    n_embd: int
    n_head: int
    n_ff: int
    n_layer: int
    eps: float


def tower_figures(meta: Mapping[str, Any], keys: type[Keys.ClipVision] | type[Keys.ClipAudio] = CV) -> TowerFigures:
    """clip.vision.* (or clip.audio.*) embedding_length, head_count, feed_forward_length, block_count and
    layer_norm_epsilon; a missing key raises KeyError with its name (the readers' BadInput)."""
    return TowerFigures(n_embd=int(meta[keys.EMBEDDING_LENGTH]), n_head=int(meta[keys.Attention.HEAD_COUNT]),
                        n_ff=int(meta[keys.FEED_FORWARD_LENGTH]), n_layer=int(meta[keys.BLOCK_COUNT]),
                        eps=float(meta[keys.Attention.LAYERNORM_EPS]))


def ffn_unary(meta: Mapping[str, Any]) -> str:
    """load_hparams' FFN op: GELU where clip.use_gelu, SILU where clip.use_silu, else GELU_QUICK."""
    return "GELU" if meta.get(CV.USE_GELU) else "SILU" if meta.get(CV.USE_SILU) else "GELU_QUICK"


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
    warmup_image_size: int   # get_dummy_batch's square image side

    @property
    def n_patches_side(self) -> int:
        return self.warmup_image_size // self.patch_size


@dataclass(frozen=True)
class AudioHParams(ClipHParams):
    """load_hparams' audio figures: image_size 0 and patch_size 1 as clip.cpp sets them, the warmup
    "image" WARMUP_AUDIO_FRAMES frames (warmup_image_size) x n_mel_bins; stack_factor where the
    projector stacks frames (whisper-enc's types)."""

    n_mel_bins: int = 0
    stack_factor: int = 0


def audio_projector_type(model: ModelFile) -> str:
    """load_hparams for the audio modality: clip.projector_type, else clip.audio.projector_type."""
    meta = model.metadata
    return str(meta.get(Keys.Clip.PROJECTOR_TYPE) or meta.get(CA.PROJECTOR_TYPE) or "")


def name(kind: MODEL_TENSOR, bid: int | None = None, suffix: str | None = "weight") -> str:
    base = TENSOR_NAMES[kind].format(bid=bid)
    return f"{base}.{suffix}" if suffix else base


def projector_type(model: ModelFile) -> str:
    """clip.projector_type, or clip.vision.projector_type for mixed-modality files (load_hparams)."""
    return str(model.metadata.get(Keys.Clip.PROJECTOR_TYPE) or model.metadata.get(CV.PROJECTOR_TYPE) or "")


@dataclass(frozen=True)
class SiglipHead:
    """What a siglip.cpp projector type adds to the ViT: its mm.* tensors (clip.cpp load_tensors),
    the tensor and dimension clip_n_mmproj_embd reads the output width from, load_hparams' n_merge,
    whether load_tensors' is_ffn_swapped list names it, whether build resizes the learned positions
    to the image (resize_position_embeddings), the (min, max) image tokens load_hparams passes
    to set_limit_image_tokens or the tokens it passes to set_warmup_n_tokens (neither: the warmup
    image is image_size), and whether the head merges patches (n_merge read from the file)."""

    tensors: tuple[str, ...]
    width_tensor: str
    width_dim: int
    default_merge: int
    swaps_ffn: bool
    resizes_positions: bool = False
    token_limits: tuple[int, int] | None = None
    warmup_tokens: int | None = None
    merges: bool = True
    cls_token: bool = False      # a class embedding concatenated after the patches (InternVL)
    min_merge: int = 2           # build_patch_merge_permute asserts > 1; InternVL's shuffle takes 1


def _mlp(a: int, b: int) -> tuple[str, ...]:
    return tuple(name(T.V_MMPROJ, i, s) for i in (a, b) for s in ("weight", "bias"))


_LFM2_MM = (name(T.V_MM_INP_NORM), name(T.V_MM_INP_NORM, None, "bias"), name(T.V_MMPROJ, 1),
            name(T.V_MMPROJ, 1, "bias"), name(T.V_MMPROJ, 2), name(T.V_MMPROJ, 2, "bias"))
HEADS: dict[str, SiglipHead] = {
    VisionProjectorType.GEMMA3: SiglipHead((name(T.V_MM_INP_PROJ), name(T.V_MM_SOFT_EMB_NORM)),
                                           name(T.V_MM_INP_PROJ), 0, GEMMA3_N_MERGE, True),
    VisionProjectorType.IDEFICS3: SiglipHead((name(T.V_MMPROJ_FC),), name(T.V_MMPROJ_FC), 1, 1, True),
    # LFM2-VL: processor_config.json's 64..256 tokens (clip.cpp load_hparams, PROJECTOR_TYPE_LFM2)
    VisionProjectorType.LFM2: SiglipHead(_LFM2_MM, name(T.V_MMPROJ, 2), 1, 1, False, True, (64, 256)),
    VisionProjectorType.JANUS_PRO: SiglipHead(_mlp(0, 1), name(T.V_MMPROJ, 1, "bias"), 0, 1, False, merges=False),
    VisionProjectorType.INTERNVL: SiglipHead(
        (name(T.V_ENC_EMBD_CLS, None, None), *(name(T.V_MMPROJ_MLP, i, s) for i in (0, 1, 3)
                                               for s in ("weight", "bias"))),
        name(T.V_MMPROJ_MLP, 3), 1, 1, False, cls_token=True, min_merge=1),
    # Phi-4: n_merge 1 and a 16 x 16-token warmup image ("avoid OOM on warmup", load_hparams)
    VisionProjectorType.PHI4: SiglipHead(_mlp(0, 2), name(T.V_MMPROJ, 2), 1, 1, False, True, warmup_tokens=16 * 16,
                                         merges=False),
}


# every projector type with a graph builder: HEADS' (the SigLIP towers of clip.py), then the types of
# clip_families.FAMILIES, whose builders are modules of their own (test_clip_families keeps the two lists
# one). "gemma4uv", "gemma4ua", "resampler" (MiniCPM-V) and "mlp" (LLaVA) are clip-impl.h's
# PROJECTOR_TYPE_NAMES that gguf-py's enum does not list.
SUPPORTED = (*HEADS, P.QWEN2VL, P.QWEN25VL, P.QWEN3VL, P.PIXTRAL,
             P.GEMMA4V, "gemma4uv", P.GEMMA3NV, P.LLAMA4, P.GLM4V, P.GEMMA4A, "gemma4ua",
             P.ULTRAVOX, P.QWEN2A, P.VOXTRAL, P.MUSIC_FLAMINGO, P.MERALION, P.GLMA, P.QWEN3A, P.LFM2A,
             "resampler", P.KIMIVL, P.KIMIK25, P.PADDLEOCR, "mlp", P.LIGHTONOCR)


def warmup_image_size(head: SiglipHead, image_size: int, patch_size: int, n_merge: int, image_max_tokens: int) -> int:
    """clip-model.h set_limit_image_tokens: the side of the largest image the preprocessor admits,
    sqrt(max tokens x (patch x merge)^2) truncated, --image-max-tokens replacing the model's maximum."""
    if head.warmup_tokens is not None:     # set_warmup_n_tokens: sqrt(n) x patch x merge
        return math.isqrt(head.warmup_tokens) * patch_size * n_merge
    if head.token_limits is None:
        return image_size
    tokens = image_max_tokens if image_max_tokens > 0 else head.token_limits[1]
    return math.isqrt(tokens * (patch_size * n_merge) ** 2)


def read_clip_hparams(model: ModelFile, image_max_tokens: int = -1) -> ClipHParams:
    """The vision hparams of a projector file whose type HEADS knows; others are refused by name."""
    meta = model.metadata
    proj = projector_type(model)
    head = HEADS.get(proj)
    if head is None or not meta.get(Keys.Clip.HAS_VISION_ENCODER):
        raise UnsupportedProjector(model.path, proj or "(none)")
    width = required_tensor(model, proj, head.width_tensor)
    with reading_keys(model):
        image, patch = int(meta[CV.IMAGE_SIZE]), int(meta[CV.PATCH_SIZE])
        merge = int(meta.get(CV.Projector.SCALE_FACTOR, head.default_merge)) if head.merges else head.default_merge
        hp = ClipHParams(proj, **tower_figures(meta), image_size=image, patch_size=patch, n_merge=merge,
                         ffn_op=ffn_unary(meta), n_mmproj_embd=width.shape[head.width_dim],
                         warmup_image_size=warmup_image_size(head, image, patch, merge, image_max_tokens))
    if head.merges and (hp.n_merge < head.min_merge or hp.n_patches_side % hp.n_merge):
        # build_patch_merge_permute asserts a factor > 1 and pads a side it does not divide (ggml_pad:
        # not modelled); Gemma 3's pool needs the factor to divide the side as well
        raise UnsupportedProjector(model.path, f"{proj} merging {hp.n_merge}x{hp.n_merge} of "
                                               f"{hp.n_patches_side}x{hp.n_patches_side} patches")
    return hp


# --- the tensors clip.cpp load_tensors asks for (the generic vision set plus the head's mm.*) ------

_LAYER_TENSORS = (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V, T.V_ENC_ATTN_O, T.V_ENC_INPUT_NORM,
                  T.V_ENC_POST_ATTN_NORM, T.V_ENC_FFN_UP, T.V_ENC_FFN_GATE, T.V_ENC_FFN_DOWN, T.V_LAYER_SCALE_1,
                  T.V_LAYER_SCALE_2)
_MODEL_TENSORS = (T.V_ENC_EMBD_PATCH, T.V_ENC_EMBD_POS, T.V_PRE_NORM, T.V_POST_NORM)


def tensor_names(hp: ClipHParams) -> list[str]:
    """Every name the graph reads, weights and biases, in load order."""
    names = [name(k, None, s) for k in _MODEL_TENSORS for s in ("weight", "bias")]
    names += [name(k, il, s) for il in range(hp.n_layer) for k in _LAYER_TENSORS for s in ("weight", "bias")]
    return names + list(HEADS[hp.projector].tensors)


def load_weights(model: ModelFile, hp: ClipHParams, names: list[str] | None = None) -> dict[str, Tensor]:
    """The projector's weights as clip.cpp loads them (absent optional biases stay absent); a tensor
    the graph does not read (a layer scale, a pre-norm) is refused rather than ignored. `names`: the
    builder's own list (default: the SigLIP tower's with the head's)."""
    known = set(names if names is not None else tensor_names(hp))
    extra = [t.name for t in model.tensors if t.name not in known]
    if extra:
        raise UnsupportedProjector(model.path, f"{hp.projector} with {extra[0]}")
    return {t.name: Tensor(t.ggml_type, t.shape, name=t.name) for t in model.tensors}
