"""Shape-faithful sparse projector (mmproj) GGUFs, as the pinned mtmd loader reads them: Gemma 3's,
SmolVLM2's (IDEFICS3), LFM2-VL's (LFM2), Janus-Pro's and Phi-4's (one SigLIP tower, five heads), and
Qwen2.5-VL's (models/qwen2vl.cpp).

The layout is Gemma 3's SigLIP-So400m vision tower with its projector (PROJECTOR_TYPE_GEMMA3), as
tools/mtmd/clip.cpp loads it at the pinned build: `load_hparams` (clip.* keys; Gemma 3 merges 4x4
patches, KEY_PROJ_SCALE_FACTOR optional) and `load_tensors` (v.patch_embd, v.position_embd,
v.blk.N.{attn_q,attn_k,attn_v,attn_out,ln1,ln2,ffn_up,ffn_down}, v.post_ln, mm.input_projection,
mm.soft_emb_norm). Types follow convert_hf_to_gguf.py's Gemma 3 vision model: 2-D weights F16, the
patch and position embeddings and every 1-D tensor F32. The FFN is stored as the converter names
it (ffn_down holds fc1, {n_embd, n_ff}); clip.cpp swaps such up/down pairs back for Gemma 3.

Names come from gguf-py's TENSOR_NAMES (V_ENC_*, V_MM_*) and keys from gguf.Keys; tensor data is
a sparse hole (planner/synth/gguf_factory.py write_model). `n_layer` defaults to the real 27.
"""
from __future__ import annotations

import math
from pathlib import Path

from gguf import MODEL_TENSOR, GGUFValueType, Keys, VisionProjectorType
from gguf import GGMLQuantizationType as Q

from planner.synth.gguf_factory import ModelSpec, T, Typed, write_once

CLIP_ARCH = "clip"
# SigLIP-So400m/14 at 896 px, as Gemma 3's vision tower (HF config vision_config)
SIGLIP_N_EMBD = 1152
SIGLIP_N_FF = 4304
SIGLIP_N_HEAD = 16
SIGLIP_N_LAYER = 27
SIGLIP_IMAGE_SIZE = 896
SIGLIP_PATCH_SIZE = 14
SIGLIP_EPS = 1e-6


def _linear(spec: ModelSpec, kind: MODEL_TENSOR, i: int | None, k: int, m: int, bias: bool,
            weight_type: Q = Q.F16) -> None:
    """A linear layer {k, m} in `weight_type`, with its F32 bias {m} when `bias`."""
    spec.add(kind, weight_type, (k, m), i)
    if bias:
        spec.add(kind, Q.F32, (m,), i, "bias")


def _layer_norm(spec: ModelSpec, kind: MODEL_TENSOR, n: int, i: int | None = None) -> None:
    """A LayerNorm's F32 weight and bias {n}."""
    spec.add(kind, Q.F32, (n,), i)
    spec.add(kind, Q.F32, (n,), i, "bias")


def _vit_layer(spec: ModelSpec, i: int, n_embd: int, n_ff: int, weight_type: Q,
               fc1: MODEL_TENSOR = T.V_ENC_FFN_UP, fc2: MODEL_TENSOR = T.V_ENC_FFN_DOWN) -> None:
    """One pre-norm ViT layer biased throughout, as build_vit reads it: q/k/v/out, the ln1/ln2 layer
    norms, fc1 {n_embd, n_ff} and fc2 {n_ff, n_embd} (named fc1 -> ffn_down by converters that swap them)."""
    for kind in (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V, T.V_ENC_ATTN_O):
        _linear(spec, kind, i, n_embd, n_embd, True, weight_type)
    for kind in (T.V_ENC_INPUT_NORM, T.V_ENC_POST_ATTN_NORM):
        _layer_norm(spec, kind, n_embd, i)
    _linear(spec, fc1, i, n_embd, n_ff, True, weight_type)
    _linear(spec, fc2, i, n_ff, n_embd, True, weight_type)


def _vision_spec(projector: str, act: str | None, *, n_text_embd: int, n_embd: int, n_ff: int, n_layer: int,
                 n_head: int, eps: float, image_size: int, patch_size: int, mean: list[float], std: list[float],
                 **extra: object) -> ModelSpec:
    """A clip file with a vision encoder and the keys load_hparams reads, in the converters' order: the
    projector type, the encoder flag, `act` (clip.use_gelu / clip.use_silu, set True) where given, the
    tower's sizes, the image and patch size, `extra` (keyed by their full names) and the normalization."""
    cv, clip = Keys.ClipVision, Keys.Clip
    spec = ModelSpec(CLIP_ARCH)
    spec.metadata.update({clip.PROJECTOR_TYPE: projector, clip.HAS_VISION_ENCODER: True})
    if act is not None:
        spec.metadata[act] = True
    spec.metadata.update({
        cv.EMBEDDING_LENGTH: n_embd, cv.FEED_FORWARD_LENGTH: n_ff, cv.BLOCK_COUNT: n_layer,
        cv.PROJECTION_DIM: n_text_embd, cv.Attention.HEAD_COUNT: n_head, cv.Attention.LAYERNORM_EPS: eps,
        cv.IMAGE_SIZE: image_size, cv.PATCH_SIZE: patch_size, **extra, cv.IMAGE_MEAN: mean, cv.IMAGE_STD: std,
    })
    return spec


def _audio_spec(projector: str, *, n_text_embd: int, n_embd: int, n_ff: int, n_layer: int, n_head: int,
                eps: float) -> ModelSpec:
    """A clip file with an audio encoder and its clip.audio.* keys in conversion/ultravox.py's order."""
    ca, clip = Keys.ClipAudio, Keys.Clip
    spec = ModelSpec(CLIP_ARCH)
    spec.metadata.update({
        clip.PROJECTOR_TYPE: projector, clip.HAS_AUDIO_ENCODER: True, ca.PROJECTION_DIM: n_text_embd,
        ca.EMBEDDING_LENGTH: n_embd, ca.FEED_FORWARD_LENGTH: n_ff, ca.BLOCK_COUNT: n_layer,
        ca.Attention.HEAD_COUNT: n_head, ca.Attention.LAYERNORM_EPS: eps, ca.NUM_MEL_BINS: WHISPER_N_MEL,
    })
    return spec


def _gated_ffn(spec: ModelSpec, i: int, n_embd: int, n_ff: int, weight_type: Q) -> None:
    """A bias-free gated FFN: gate and up {n_embd, n_ff}, down {n_ff, n_embd}."""
    for kind in (T.V_ENC_FFN_GATE, T.V_ENC_FFN_UP):
        spec.add(kind, weight_type, (n_embd, n_ff), i)
    spec.add(T.V_ENC_FFN_DOWN, weight_type, (n_ff, n_embd), i)


def _siglip(projector: str, n_text_embd: int, n_layer: int, n_embd: int, n_ff: int, n_head: int,
            image_size: int, patch_size: int, weight_type: Q, patch_type: Q, swapped: bool = True) -> ModelSpec:
    """The SigLIP tower clip.cpp's build_vit reads: patch and position embeddings, pre-norm layers
    with biased q/k/v/out and a GELU FFN, the post layer norm. `swapped`: the FFN named as the
    converter names it for the types in load_tensors' is_ffn_swapped list (Gemma 3, IDEFICS3)."""
    spec = _vision_spec(projector, Keys.ClipVision.USE_GELU, n_text_embd=n_text_embd, n_embd=n_embd, n_ff=n_ff,
                        n_layer=n_layer, n_head=n_head, eps=SIGLIP_EPS, image_size=image_size, patch_size=patch_size,
                        mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])
    n_patches = (image_size // patch_size) ** 2
    spec.add(T.V_ENC_EMBD_PATCH, patch_type, (patch_size, patch_size, 3, n_embd))
    spec.add(T.V_ENC_EMBD_PATCH, Q.F32, (n_embd,), suffix="bias")
    spec.add(T.V_ENC_EMBD_POS, Q.F32, (n_embd, n_patches))
    fc1, fc2 = (T.V_ENC_FFN_DOWN, T.V_ENC_FFN_UP) if swapped else (T.V_ENC_FFN_UP, T.V_ENC_FFN_DOWN)
    for i in range(n_layer):
        _vit_layer(spec, i, n_embd, n_ff, weight_type, fc1, fc2)
    _layer_norm(spec, T.V_POST_NORM, n_embd)
    return spec


def gemma3_mmproj_spec(*, n_text_embd: int = 640, n_layer: int = SIGLIP_N_LAYER, n_embd: int = SIGLIP_N_EMBD,
                       n_ff: int = SIGLIP_N_FF, n_head: int = SIGLIP_N_HEAD, image_size: int = SIGLIP_IMAGE_SIZE,
                       patch_size: int = SIGLIP_PATCH_SIZE, weight_type: Q = Q.F16) -> ModelSpec:
    """Gemma 3's projector for a text model of width `n_text_embd` (the 270M's is 640)."""
    spec = _siglip(VisionProjectorType.GEMMA3, n_text_embd, n_layer, n_embd, n_ff, n_head, image_size, patch_size,
                   weight_type, Q.F32)
    spec.add(T.V_MM_INP_PROJ, Q.F16, (n_text_embd, n_embd))
    spec.add(T.V_MM_SOFT_EMB_NORM, Q.F32, (n_embd,))
    return spec


def idefics3_mmproj_spec(*, n_text_embd: int = 640, n_layer: int = 12, n_embd: int = 768, n_ff: int = 3072,
                         n_head: int = 12, image_size: int = 512, patch_size: int = 16, scale_factor: int = 4,
                         weight_type: Q = Q.F16) -> ModelSpec:
    """SmolVLM2's (IDEFICS3) projector: SigLIP-B/16 at 512 px, pixel unshuffle by 4, one linear layer
    (mm.model.fc, {n_embd x 16, n_text}) — defaults as SmolVLM2-256M's vision config."""
    spec = _siglip(VisionProjectorType.IDEFICS3, n_text_embd, n_layer, n_embd, n_ff, n_head, image_size,
                   patch_size, weight_type, Q.F16)
    spec.metadata[Keys.ClipVision.Projector.SCALE_FACTOR] = scale_factor
    spec.add(T.V_MMPROJ_FC, weight_type, (n_embd * scale_factor**2, n_text_embd))
    return spec


def lfm2_mmproj_spec(*, n_text_embd: int = 640, n_layer: int = 12, n_embd: int = 768, n_ff: int = 3072,
                     n_head: int = 12, image_size: int = 256, patch_size: int = 16, scale_factor: int = 2,
                     n_hidden: int = 2560, weight_type: Q = Q.F16) -> ModelSpec:
    """LFM2-VL's (LFM2) projector: a SigLIP2-B/16 NaFlex tower with a 16 x 16 position table, pixel
    unshuffle by 2, a layer norm and a two-layer GELU MLP (mm.1 {n_embd x 4, n_hidden}, mm.2
    {n_hidden, n_text}) — LFM2-VL-450M's shape."""
    spec = _siglip(VisionProjectorType.LFM2, n_text_embd, n_layer, n_embd, n_ff, n_head, image_size,
                   patch_size, weight_type, Q.F16, swapped=False)
    spec.metadata[Keys.ClipVision.Projector.SCALE_FACTOR] = scale_factor
    merged = n_embd * scale_factor**2
    _layer_norm(spec, T.V_MM_INP_NORM, merged)
    _linear(spec, T.V_MMPROJ, 1, merged, n_hidden, True, weight_type)
    _linear(spec, T.V_MMPROJ, 2, n_hidden, n_text_embd, True, weight_type)
    return spec


def janus_pro_mmproj_spec(*, n_text_embd: int = 640, n_layer: int = 24, n_embd: int = 1024, n_ff: int = 4096,
                          n_head: int = 16, image_size: int = 384, patch_size: int = 16,
                          weight_type: Q = Q.F16) -> ModelSpec:
    """Janus-Pro's (JANUS_PRO) projector: SigLIP-L/16 at 384 px and a two-layer GELU aligner (mm.0,
    mm.1) to the text width — Janus-Pro-1B's vision shape."""
    spec = _siglip(VisionProjectorType.JANUS_PRO, n_text_embd, n_layer, n_embd, n_ff, n_head, image_size,
                   patch_size, weight_type, Q.F16, swapped=False)
    for i, (k, m) in enumerate(((n_embd, n_text_embd), (n_text_embd, n_text_embd))):
        _linear(spec, T.V_MMPROJ, i, k, m, True, weight_type)
    return spec


def phi4_mmproj_spec(*, n_text_embd: int = 640, n_layer: int = 27, n_embd: int = 1152, n_ff: int = 4304,
                     n_head: int = 16, image_size: int = 448, patch_size: int = 14,
                     weight_type: Q = Q.F16) -> ModelSpec:
    """Phi-4's (PHI4) projector: SigLIP-So400m/14 at 448 px (a 32 x 32 position table), mm.0 / mm.2
    GELU MLP; load_hparams requires the preprocessor's pixel limits."""
    spec = _siglip(VisionProjectorType.PHI4, n_text_embd, n_layer, n_embd, n_ff, n_head, image_size,
                   patch_size, weight_type, Q.F16, swapped=False)
    spec.metadata[Keys.ClipVision.IMAGE_MIN_PIXELS] = 256 * patch_size**2
    spec.metadata[Keys.ClipVision.IMAGE_MAX_PIXELS] = 1024 * patch_size**2
    for i, (k, m) in ((0, (n_embd, n_text_embd)), (2, (n_text_embd, n_text_embd))):
        _linear(spec, T.V_MMPROJ, i, k, m, True, weight_type)
    return spec


def internvl_mmproj_spec(*, n_text_embd: int = 640, n_layer: int = 24, n_embd: int = 1024, n_ff: int = 4096,
                         n_head: int = 16, image_size: int = 448, patch_size: int = 14, scale_factor: int = 2,
                         weight_type: Q = Q.F16) -> ModelSpec:
    """InternVL's (internvl) projector: InternViT-300M/14 at 448 px (a class token, layer scales, no
    post norm), pixel shuffle by 2, LayerNorm + GELU MLP (mm.model.mlp.0/1/3) — InternVL3-1B's shape."""
    spec = _siglip(VisionProjectorType.INTERNVL, n_text_embd, n_layer, n_embd, n_ff, n_head, image_size,
                   patch_size, weight_type, Q.F16, swapped=False)
    spec.metadata[Keys.ClipVision.Projector.SCALE_FACTOR] = scale_factor
    n_patches = (image_size // patch_size) ** 2
    spec.tensors = [t for t in spec.tensors if not t[0].startswith(("v.post_ln", "v.position_embd"))]
    spec.add(T.V_ENC_EMBD_POS, Q.F32, (n_embd, n_patches + 1))
    spec.add(T.V_ENC_EMBD_CLS, Q.F32, (n_embd,), suffix=None)
    for i in range(n_layer):
        spec.add(T.V_LAYER_SCALE_1, Q.F32, (n_embd,), i)
        spec.add(T.V_LAYER_SCALE_2, Q.F32, (n_embd,), i)
    merged = n_embd * scale_factor**2
    _layer_norm(spec, T.V_MMPROJ_MLP, merged, 0)
    for i, (k, m) in ((1, (merged, n_text_embd)), (3, (n_text_embd, n_text_embd))):
        _linear(spec, T.V_MMPROJ_MLP, i, k, m, True, weight_type)
    return spec


def pixtral_mmproj_spec(*, n_text_embd: int = 640, n_layer: int = 24, n_embd: int = 1024, n_ff: int = 4096,
                        n_head: int = 16, patch_size: int = 14, merge: int = 2, weight_type: Q = Q.F16) -> ModelSpec:
    """Mistral Small 3.1's (pixtral) projector: a 24-layer Pixtral ViT/14 (RMS norms, a pre-norm, a
    SiLU-gated FFN, no biases, no position table), the 2x2 patch merger, a GELU MLP (mm.1, mm.2) and
    the [IMG_BREAK] embedding."""
    cv = Keys.ClipVision
    spec = _vision_spec(VisionProjectorType.PIXTRAL, cv.USE_SILU, n_text_embd=n_text_embd, n_embd=n_embd, n_ff=n_ff,
                        n_layer=n_layer, n_head=n_head, eps=1e-5, image_size=1540, patch_size=patch_size,
                        mean=[0.48, 0.46, 0.41], std=[0.27, 0.26, 0.28], **{cv.SPATIAL_MERGE_SIZE: merge})
    spec.add(T.V_ENC_EMBD_PATCH, Q.F16, (patch_size, patch_size, 3, n_embd))
    spec.add(T.V_PRE_NORM, Q.F32, (n_embd,))
    for i in range(n_layer):
        for kind in (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V, T.V_ENC_ATTN_O):
            spec.add(kind, weight_type, (n_embd, n_embd), i)
        spec.add(T.V_ENC_INPUT_NORM, Q.F32, (n_embd,), i)
        spec.add(T.V_ENC_POST_ATTN_NORM, Q.F32, (n_embd,), i)
        _gated_ffn(spec, i, n_embd, n_ff, weight_type)
    spec.add(T.V_MM_INP_NORM, Q.F32, (n_embd,))
    spec.add(T.V_MM_PATCH_MERGER, weight_type, (n_embd * merge**2, n_embd))
    spec.add(T.V_MMPROJ, weight_type, (n_embd, n_text_embd), 1)
    spec.add(T.V_MMPROJ, weight_type, (n_text_embd, n_text_embd), 2)
    spec.add(T.V_TOK_EMBD_IMG_BREAK, Q.F32, (n_text_embd,), suffix=None)
    return spec


def qwen25vl_mmproj_spec(*, n_text_embd: int = 640, n_layer: int = 32, n_embd: int = 1280, n_ff: int = 3420,
                         n_head: int = 16, patch_size: int = 14, n_wa_pattern: int = 8,
                         weight_type: Q = Q.F16) -> ModelSpec:
    """Qwen2.5-VL's (qwen2.5vl_merger) projector, as clip.cpp loads it: two patch kernels, no position
    table, RMS norms, a SwiGLU FFN with biases, window attention on all but every 8th layer, and the
    4-patch merger mm.0 {4 n_embd, 4 n_embd} / mm.2 {4 n_embd, n_text} — Qwen2.5-VL-3B's vision shape."""
    cv = Keys.ClipVision
    spec = _vision_spec(VisionProjectorType.QWEN25VL, cv.USE_SILU, n_text_embd=n_text_embd, n_embd=n_embd, n_ff=n_ff,
                        n_layer=n_layer, n_head=n_head, eps=SIGLIP_EPS, image_size=560, patch_size=patch_size,
                        mean=[0.48, 0.46, 0.41], std=[0.27, 0.26, 0.28], **{cv.N_WA_PATTERN: n_wa_pattern})
    spec.add(T.V_ENC_EMBD_PATCH, Q.F16, (patch_size, patch_size, 3, n_embd))
    spec.add(T.V_ENC_EMBD_PATCH, Q.F16, (patch_size, patch_size, 3, n_embd), suffix="weight.1")
    for i in range(n_layer):
        for kind in (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V, T.V_ENC_ATTN_O):
            _linear(spec, kind, i, n_embd, n_embd, True, weight_type)
        spec.add(T.V_ENC_INPUT_NORM, Q.F32, (n_embd,), i)
        spec.add(T.V_ENC_POST_ATTN_NORM, Q.F32, (n_embd,), i)
        for kind in (T.V_ENC_FFN_UP, T.V_ENC_FFN_GATE):
            _linear(spec, kind, i, n_embd, n_ff, True, weight_type)
        _linear(spec, T.V_ENC_FFN_DOWN, i, n_ff, n_embd, True, weight_type)
    spec.add(T.V_POST_NORM, Q.F32, (n_embd,))
    for i, (k, m) in ((0, (4 * n_embd, 4 * n_embd)), (2, (4 * n_embd, n_text_embd))):
        _linear(spec, T.V_MMPROJ, i, k, m, True, weight_type)
    return spec


def qwen2vl_mmproj_spec(*, n_text_embd: int = 640, n_layer: int = 32, n_embd: int = 1280, n_ff: int = 5120,
                        n_head: int = 16, patch_size: int = 14, weight_type: Q = Q.F16) -> ModelSpec:
    """Qwen2-VL's (qwen2vl_merger) projector: as Qwen2.5-VL's but with biased layer norms, a quick-GELU
    FFN without a gate and no window attention — Qwen2-VL-2B's vision shape."""
    spec = qwen25vl_mmproj_spec(n_text_embd=n_text_embd, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head,
                                patch_size=patch_size, weight_type=weight_type)
    spec.metadata[Keys.Clip.PROJECTOR_TYPE] = VisionProjectorType.QWEN2VL
    for k in (Keys.ClipVision.USE_SILU, Keys.ClipVision.N_WA_PATTERN):
        del spec.metadata[k]
    spec.tensors = [t for t in spec.tensors if ".ffn_gate." not in t[0]]
    for i in range(n_layer):
        spec.add(T.V_ENC_INPUT_NORM, Q.F32, (n_embd,), i, "bias")
        spec.add(T.V_ENC_POST_ATTN_NORM, Q.F32, (n_embd,), i, "bias")
    spec.add(T.V_POST_NORM, Q.F32, (n_embd,), suffix="bias")
    return spec


def qwen3vl_mmproj_spec(*, n_text_embd: int = 640, n_layer: int = 24, n_embd: int = 1024, n_ff: int = 4096,
                        n_head: int = 16, patch_size: int = 16, deepstack: tuple[int, ...] = (5, 11, 17),
                        n_pos_table: int = 48 * 48, weight_type: Q = Q.F16) -> ModelSpec:
    """Qwen3-VL's (qwen3vl_merger) projector: two patch kernels with a bias, a 48 x 48 position table,
    biased layer norms, a fused qkv, a GELU FFN, the 4-patch merger and three deepstack mergers; the
    text width is the merger's times (1 + deepstack layers) — Qwen3-VL-2B's vision shape."""
    cv = Keys.ClipVision
    out = n_text_embd // (1 + len(deepstack))
    spec = _vision_spec(VisionProjectorType.QWEN3VL, cv.USE_GELU, n_text_embd=out, n_embd=n_embd, n_ff=n_ff,
                        n_layer=n_layer, n_head=n_head, eps=SIGLIP_EPS, image_size=768, patch_size=patch_size,
                        mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5],
                        **{cv.SPATIAL_MERGE_SIZE: 2, cv.IS_DEEPSTACK_LAYERS: [i in deepstack for i in range(n_layer)]})
    spec.add(T.V_ENC_EMBD_PATCH, Q.F16, (patch_size, patch_size, 3, n_embd))
    spec.add(T.V_ENC_EMBD_PATCH, Q.F16, (patch_size, patch_size, 3, n_embd), suffix="weight.1")
    spec.add(T.V_ENC_EMBD_PATCH, Q.F32, (n_embd,), suffix="bias")
    spec.add(T.V_ENC_EMBD_POS, Q.F32, (n_embd, n_pos_table))
    for i in range(n_layer):
        _linear(spec, T.V_ENC_ATTN_QKV, i, n_embd, 3 * n_embd, True, weight_type)
        _linear(spec, T.V_ENC_ATTN_O, i, n_embd, n_embd, True, weight_type)
        for kind in (T.V_ENC_INPUT_NORM, T.V_ENC_POST_ATTN_NORM):
            _layer_norm(spec, kind, n_embd, i)
        _linear(spec, T.V_ENC_FFN_UP, i, n_embd, n_ff, True, weight_type)
        _linear(spec, T.V_ENC_FFN_DOWN, i, n_ff, n_embd, True, weight_type)
        if i in deepstack:
            _layer_norm(spec, T.V_DS_NORM, 4 * n_embd, i)
            _linear(spec, T.V_DS_FC1, i, 4 * n_embd, 4 * n_embd, True, weight_type)
            _linear(spec, T.V_DS_FC2, i, 4 * n_embd, out, True, weight_type)
    _layer_norm(spec, T.V_POST_NORM, n_embd)
    for i, (k, m) in ((0, (4 * n_embd, 4 * n_embd)), (2, (4 * n_embd, out))):
        _linear(spec, T.V_MMPROJ, i, k, m, True, weight_type)
    return spec


def write_mmproj(directory: Path, spec: ModelSpec, name: str) -> Path:
    """Write a projector spec into `directory` (once per name) and return its path."""
    return write_once(directory, name, lambda: spec)


def write_gemma3_mmproj(directory: Path, name: str = "mmproj-gemma3", **kw: object) -> Path:
    """Write Gemma 3's projector into `directory` (once per name) and return its path."""
    return write_mmproj(directory, gemma3_mmproj_spec(**kw), name)   # type: ignore[arg-type]


# --- proja: Gemma 4 (gemma4v, gemma4uv) ---------------------------------------------------------
# Gemma 4's projectors (gemma4v, gemma4uv) as the pinned mtmd loader reads them.
#
# gemma4v: the layout conversion/gemma.py Gemma4VisionAudioModel writes for the vision tower and
# tools/mtmd/clip.cpp load_tensors asks for: v.patch_embd (the linear patch embedder reshaped to a
# conv kernel, F16), v.position_embd as the x and y tables [n_embd, n, 2] (F32), per layer
# attn_q/k/v/out (no biases), per-head attn_q_norm/attn_k_norm, ln1 (input), attn_post_norm, ln2
# (pre-FFN), ffn_post_norm, a gated FFN and the layer's out_scale, then mm.input_projection
# {n_embd, n_text}; with `standardize`, v.std_bias and v.std_scale; with `clipped`, each linear's
# four clamp scalars (Gemma4ClippableLinear). The converter writes image_size 224 ("unused") and no
# use_gelu. Defaults: Gemma 4 E4B's vision tower (hidden 768, 16 layers, 12 heads, FFN 3072, patch
# 16, pooling 3, a 10240-entry position table).
#
# gemma4uv: the unified models' embedder (Gemma4UnifiedVisionAudioModel): v.patch_embd as a linear
# {3 p^2, n_text} with its bias, v.patch_norm.{1,2,3} layer norms, the position tables, and
# mm.input_projection; no transformer (block count 0).
GEMMA4_CLAMP_SUFFIXES = ("input_max", "input_min", "output_max", "output_min")


def _gemma4_spec(projector: str, n_text_embd: int, n_embd: int, n_ff: int, n_layer: int, n_head: int,
                 patch_size: int) -> ModelSpec:
    return _vision_spec(projector, None, n_text_embd=n_text_embd, n_embd=n_embd, n_ff=n_ff, n_layer=n_layer,
                        n_head=n_head, eps=1e-6, image_size=224, patch_size=patch_size, mean=[0.0, 0.0, 0.0],
                        std=[1.0, 1.0, 1.0])


def gemma4v_mmproj_spec(*, n_text_embd: int = 640, n_layer: int = 16, n_embd: int = 768, n_ff: int = 3072,
                        n_head: int = 12, patch_size: int = 16, n_pos_table: int = 10240, standardize: bool = False,
                        clipped: bool = False, weight_type: Q = Q.F16) -> ModelSpec:
    """Gemma 4's vision projector (defaults: E4B's tower) for a text model of width `n_text_embd`."""
    spec = _gemma4_spec(VisionProjectorType.GEMMA4V, n_text_embd, n_embd, n_ff, n_layer, n_head, patch_size)
    d_head = n_embd // n_head
    spec.add(T.V_ENC_EMBD_PATCH, Q.F16, (patch_size, patch_size, 3, n_embd))
    spec.add(T.V_ENC_EMBD_POS, Q.F32, (n_embd, n_pos_table, 2))
    linears: list[tuple[MODEL_TENSOR, int | None]] = []
    for i in range(n_layer):
        for kind in (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V, T.V_ENC_ATTN_O):
            spec.add(kind, weight_type, (n_embd, n_embd), i)
            linears.append((kind, i))
        spec.add(T.V_ENC_ATTN_Q_NORM, Q.F32, (d_head,), i)
        spec.add(T.V_ENC_ATTN_K_NORM, Q.F32, (d_head,), i)
        for kind in (T.V_ENC_INPUT_NORM, T.V_ENC_ATTN_POST_NORM, T.V_ENC_POST_ATTN_NORM, T.V_ENC_FFN_POST_NORM):
            spec.add(kind, Q.F32, (n_embd,), i)
        for kind, shape in ((T.V_ENC_FFN_GATE, (n_embd, n_ff)), (T.V_ENC_FFN_UP, (n_embd, n_ff)),
                            (T.V_ENC_FFN_DOWN, (n_ff, n_embd))):
            spec.add(kind, weight_type, shape, i)
            linears.append((kind, i))
        spec.add(T.V_LAYER_OUT_SCALE, Q.F32, (1,), i)
    if standardize:
        spec.add(T.V_STD_BIAS, Q.F32, (n_embd,), suffix=None)
        spec.add(T.V_STD_SCALE, Q.F32, (n_embd,), suffix=None)
    spec.add(T.V_MM_INP_PROJ, Q.F16, (n_embd, n_text_embd))
    if clipped:
        for kind, bid in [*linears, (T.V_MM_INP_PROJ, None)]:
            for suffix in GEMMA4_CLAMP_SUFFIXES:
                spec.add(kind, Q.F32, (1,), bid, suffix)
    return spec


def gemma4uv_mmproj_spec(*, n_text_embd: int = 640, patch_size: int = 16, pool: int = 3,
                         n_pos_table: int = 10240) -> ModelSpec:
    """The unified Gemma 4 models' transformer-less vision embedder: patches of `patch_size` x `pool`
    px straight to the text width."""
    spec = _gemma4_spec("gemma4uv", n_text_embd, n_text_embd, 0, 0, 0, patch_size)
    spec.metadata[Keys.ClipVision.Projector.SCALE_FACTOR] = pool
    k = 3 * (patch_size * pool) ** 2
    spec.add(T.V_ENC_EMBD_PATCH, Q.F16, (k, n_text_embd))
    spec.add(T.V_ENC_EMBD_PATCH, Q.F32, (n_text_embd,), suffix="bias")
    spec.add(T.V_ENC_EMBD_POS, Q.F32, (n_text_embd, n_pos_table, 2))
    for i, width in ((1, k), (2, n_text_embd), (3, n_text_embd)):
        spec.tensors.append((f"v.patch_norm.{i}.weight", Q.F32, (width,)))
        spec.tensors.append((f"v.patch_norm.{i}.bias", Q.F32, (width,)))
    spec.add(T.V_MM_INP_PROJ, Q.F16, (n_text_embd, n_text_embd))
    return spec


# --- proja: Gemma 3n (gemma3nv, MobileNetV5-300M) ---------------------------------------------------
# The vision half of conversion/gemma.py Gemma3nVisionAudioModel as clip.cpp's GEMMA3NV loader reads it:
# the stem (conv 3x3 F32 with its bias [1,1,C,1] and norm), the blocks v.blk.S.B.* of timm's
# mobilenetv5_300m_enc (MNv5_300M_ARCH_DEF: stage 0 three edge residuals, stage 1 five universal
# inverted residuals, stage 2 eight UIRs, a transition UIR and 13 MQA + UIR pairs with stride-2 keys and
# values, stage 3 a UIR and 19 MQA + UIR pairs), every UIR and MQA block with a layer scale (1e-5 init),
# the multi-scale fusion adapter (stage 2's 640 and stage 3's 1280 channels to 2048, expansion 2) and
# the embedder's mm.input_projection and mm.soft_emb_norm. Conv weights are 4-D F16 ([KW, KH, IC, OC],
# depthwise [K, K, 1, C]), norms and the layer scales [1, 1, C, 1] F32 (a name not ending in .weight).
# The converter writes n_layer 128 (unused), n_ff 4 x 2048, 8 heads, a 768 px image and patch 768 / 256.
MNV5_300M_STAGES: tuple[tuple[tuple, ...], ...] = (
    (("er", 3, 2, 4, 128), ("er", 3, 1, 4, 128), ("er", 3, 1, 4, 128)),
    (("uir", 3, 5, 2, 6, 256), ("uir", 5, 0, 1, 4, 256), ("uir", 3, 0, 1, 4, 256), ("uir", 5, 0, 1, 4, 256),
     ("uir", 3, 0, 1, 4, 256)),
    (("uir", 5, 5, 2, 6, 640), *((("uir", 5, 0, 1, 4, 640),) * 7), ("uir", 0, 0, 1, 1, 640),
     *((("mqa", 12, 2, 64, 640), ("uir", 0, 0, 1, 2, 640)) * 13)),
    (("uir", 5, 5, 2, 6, 1280), *((("mqa", 16, 1, 96, 1280), ("uir", 0, 0, 1, 2, 1280)) * 19)),
)


def gemma3nv_mmproj_spec(*, n_text_embd: int = 2048, stages: tuple[tuple[tuple, ...], ...] = MNV5_300M_STAGES,
                         stem: int = 64, n_embd: int = 2048, image_size: int = 768,
                         unloaded: bool = False) -> ModelSpec:
    """Gemma 3n's vision projector (MobileNetV5-300M by default); `stages` as MNV5_300M_STAGES:
    ("er", k, stride, expansion, out), ("uir", k_start, k_mid, stride, expansion, out) or
    ("mqa", heads, kv_stride, head_dim, out). `unloaded`: also the tensors the converter writes and
    clip.cpp leaves in the file for GEMMA3NV (the hard-token embedding and its norm, and a stand-in
    for the audio conformer: one a.* layer weight and mm.a.input_projection, with has_audio_encoder)."""
    clip = Keys.Clip
    spec = _vision_spec(VisionProjectorType.GEMMA3NV, None, n_text_embd=n_text_embd, n_embd=n_embd, n_ff=4 * n_embd,
                        n_layer=128, n_head=8, eps=1e-6, image_size=image_size, patch_size=image_size // 256,
                        mean=[0.0, 0.0, 0.0], std=[1.0, 1.0, 1.0])
    add = spec.tensors.append
    add(("v.conv_stem.conv.weight", Q.F32, (3, 3, 3, stem)))
    add(("v.conv_stem.conv.bias", Q.F32, (1, 1, stem, 1)))
    add(("v.conv_stem.bn.weight", Q.F32, (stem,)))
    c, feats = stem, []
    for s, blocks in enumerate(stages):
        for b, blk in enumerate(blocks):
            p = f"v.blk.{s}.{b}."
            if blk[0] == "er":
                _, k, _, e, out = blk
                add((p + "conv_exp.weight", Q.F16, (k, k, c, c * e)))
                add((p + "bn1.weight", Q.F32, (c * e,)))
                add((p + "conv_pwl.weight", Q.F16, (1, 1, c * e, out)))
                add((p + "bn2.weight", Q.F32, (out,)))
            elif blk[0] == "uir":
                _, ks, km, _, e, out = blk
                mid = c * e
                if ks:
                    add((p + "dw_start.conv.weight", Q.F16, (ks, ks, 1, c)))
                    add((p + "dw_start.bn.weight", Q.F32, (c,)))
                add((p + "pw_exp.conv.weight", Q.F16, (1, 1, c, mid)))
                add((p + "pw_exp.bn.weight", Q.F32, (mid,)))
                if km:
                    add((p + "dw_mid.conv.weight", Q.F16, (km, km, 1, mid)))
                    add((p + "dw_mid.bn.weight", Q.F32, (mid,)))
                add((p + "pw_proj.conv.weight", Q.F16, (1, 1, mid, out)))
                add((p + "pw_proj.bn.weight", Q.F32, (out,)))
                add((p + "layer_scale.gamma", Q.F32, (1, 1, out, 1)))
            else:
                _, heads, kv_stride, d, out = blk
                add((p + "norm.weight", Q.F32, (c,)))
                add((p + "attn.query.proj.weight", Q.F16, (1, 1, c, heads * d)))
                for which in ("key", "value"):
                    if kv_stride > 1:
                        add((f"{p}attn.{which}.down_conv.weight", Q.F16, (3, 3, 1, c)))
                        add((f"{p}attn.{which}.norm.weight", Q.F32, (c,)))
                    add((f"{p}attn.{which}.proj.weight", Q.F16, (1, 1, c, d)))
                add((p + "attn.output.proj.weight", Q.F16, (1, 1, heads * d, out)))
                add((p + "layer_scale.gamma", Q.F32, (1, 1, out, 1)))
            c = blk[-1]
        feats.append(c)
    fused = sum(feats[2:4]) if len(feats) >= 4 else feats[-1]
    add(("v.msfa.ffn.pw_exp.conv.weight", Q.F16, (1, 1, fused, 2 * fused)))
    add(("v.msfa.ffn.pw_exp.bn.weight", Q.F32, (2 * fused,)))
    add(("v.msfa.ffn.pw_proj.conv.weight", Q.F16, (1, 1, 2 * fused, n_embd)))
    add(("v.msfa.ffn.pw_proj.bn.weight", Q.F32, (n_embd,)))
    add(("v.msfa.norm.weight", Q.F32, (n_embd,)))
    spec.add(T.V_MM_INP_PROJ, Q.F16, (n_embd, n_text_embd))
    spec.add(T.V_MM_SOFT_EMB_NORM, Q.F32, (n_embd,))
    if unloaded:
        spec.metadata[clip.HAS_AUDIO_ENCODER] = True
        spec.add(T.V_MM_EMBEDDING, Q.F16, (n_embd, 128))
        spec.add(T.V_MM_HARD_EMB_NORM, Q.F32, (n_embd,))
        spec.add(T.A_ENC_ATTN_Q, Q.F16, (1536, 1536), 0)
        spec.add(T.A_MM_INP_PROJ, Q.F16, (1536, n_text_embd))
    return spec


# --- proja: Llama 4 (llama4) -------------------------------------------------------------------------
def llama4_mmproj_spec(*, n_text_embd: int = 640, n_layer: int = 34, n_embd: int = 1408, n_ff: int = 5632,
                       n_head: int = 16, image_size: int = 336, patch_size: int = 14, shuffle: int = 2,
                       n_adapter: int = 4096, weight_type: Q = Q.F16) -> ModelSpec:
    """Llama 4's vision projector as conversion/llama4.py Llama4VisionModel writes it and clip.cpp's
    LLAMA4 loader reads it: the linear patch embedder {3 p^2, n_embd} (F16), the class embedding, a
    position table for the patches and the class token (F32, as the converter forces it), biased
    pre/post layer norms, layers with biased q/k/v/out, ln1/ln2 and a GELU fc1/fc2 FFN, the adapter
    MLP mm.model.mlp.1 {n_embd x shuffle^2, n_adapter} and mm.model.mlp.2, and mm.model.fc to the
    text width (no biases). Defaults: Llama-4-Scout/Maverick's vision_config (1408 wide, 34 layers,
    16 heads, 336 px / 14, pixel_shuffle_ratio 0.5, projector_input/output_dim 4096, norm_eps 1e-5)."""
    cv = Keys.ClipVision
    spec = _vision_spec(VisionProjectorType.LLAMA4, cv.USE_GELU, n_text_embd=n_text_embd, n_embd=n_embd, n_ff=n_ff,
                        n_layer=n_layer, n_head=n_head, eps=1e-5, image_size=image_size, patch_size=patch_size,
                        mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5], **{cv.Projector.SCALE_FACTOR: shuffle})
    n_patches = (image_size // patch_size) ** 2
    spec.add(T.V_ENC_EMBD_PATCH, Q.F16, (3 * patch_size**2, n_embd))
    spec.add(T.V_ENC_EMBD_CLS, Q.F32, (n_embd,), suffix=None)
    spec.add(T.V_ENC_EMBD_POS, Q.F32, (n_embd, n_patches + 1))
    _layer_norm(spec, T.V_PRE_NORM, n_embd)
    for i in range(n_layer):
        _vit_layer(spec, i, n_embd, n_ff, weight_type)
    _layer_norm(spec, T.V_POST_NORM, n_embd)
    spec.add(T.V_MMPROJ_MLP, weight_type, (n_embd * shuffle**2, n_adapter), 1)
    spec.add(T.V_MMPROJ_MLP, weight_type, (n_adapter, n_adapter), 2)
    spec.add(T.V_MMPROJ_FC, weight_type, (n_adapter, n_text_embd))
    return spec


# --- proja: GLM-4.1V / GLM-4.5V (glm4v) --------------------------------------------------------------
def glm4v_mmproj_spec(*, n_text_embd: int = 640, n_layer: int = 24, n_embd: int = 1536, n_head: int = 12,
                      n_ff: int = 13696, out_hidden: int = 4096, image_size: int = 336, patch_size: int = 14,
                      merge: int = 2, weight_type: Q = Q.F16) -> ModelSpec:
    """GLM-4V's vision projector as conversion/qwen3vl.py Glm4VVisionModel writes it and clip.cpp's GLM4V
    loader reads it: the 3-D patch conv split into v.patch_embd.weight / .weight.1 (F16) with its bias,
    the post-conv RMS norm (v.norm_embd), the position table (image_size / patch)^2 rows (F32),
    24 layers of RMS norms, a bias-free fused qkv and output, a SwiGLU FFN of width out_hidden (HF
    Glm4VisionMlp's intermediate size is the config's out_hidden_size), v.post_ln, the merger's
    merge x merge downsample conv (mm.patch_merger, F16, with its bias), mm.model.fc, mm.post_norm
    (a LayerNorm with bias) and the SwiGLU mm.gate / mm.up / mm.down of width n_ff (the config's
    intermediate_size). The merger works at the text width: `n_text_embd` stands where the real model
    has out_hidden_size (4096, its text width). Defaults: Glm4vVisionConfig (GLM-4.1V-9B)."""
    cv = Keys.ClipVision
    spec = _vision_spec(VisionProjectorType.GLM4V, cv.USE_SILU, n_text_embd=n_text_embd, n_embd=n_embd, n_ff=n_ff,
                        n_layer=n_layer, n_head=n_head, eps=1e-5, image_size=image_size, patch_size=patch_size,
                        mean=[0.48145466, 0.4578275, 0.40821073], std=[0.26862954, 0.26130258, 0.27577711],
                        **{cv.SPATIAL_MERGE_SIZE: merge})
    spec.add(T.V_ENC_EMBD_PATCH, Q.F16, (patch_size, patch_size, 3, n_embd))
    spec.add(T.V_ENC_EMBD_PATCH, Q.F16, (patch_size, patch_size, 3, n_embd), suffix="weight.1")
    spec.add(T.V_ENC_EMBD_PATCH, Q.F32, (n_embd,), suffix="bias")
    spec.add(T.V_ENC_EMBD_NORM, Q.F32, (n_embd,))
    spec.add(T.V_ENC_EMBD_POS, Q.F32, (n_embd, (image_size // patch_size) ** 2))
    for i in range(n_layer):
        spec.add(T.V_ENC_ATTN_QKV, weight_type, (n_embd, 3 * n_embd), i)
        spec.add(T.V_ENC_ATTN_O, weight_type, (n_embd, n_embd), i)
        spec.add(T.V_ENC_INPUT_NORM, Q.F32, (n_embd,), i)
        spec.add(T.V_ENC_POST_ATTN_NORM, Q.F32, (n_embd,), i)
        _gated_ffn(spec, i, n_embd, out_hidden, weight_type)
    spec.add(T.V_POST_NORM, Q.F32, (n_embd,))
    spec.add(T.V_MM_PATCH_MERGER, Q.F16, (merge, merge, n_embd, n_text_embd))
    spec.add(T.V_MM_PATCH_MERGER, Q.F32, (n_text_embd,), suffix="bias")
    spec.add(T.V_MMPROJ_FC, weight_type, (n_text_embd, n_text_embd))
    _layer_norm(spec, T.V_MM_POST_NORM, n_text_embd)
    spec.add(T.V_MM_GATE, weight_type, (n_text_embd, n_ff))
    spec.add(T.V_MM_UP, weight_type, (n_text_embd, n_ff))
    spec.add(T.V_MM_DOWN, weight_type, (n_ff, n_text_embd))
    return spec


# --- proja: Gemma 4 audio (gemma4a, gemma4ua), files that carry the audio encoder alone ---------------
def _gemma4_audio_meta(spec: ModelSpec, projector: str, n_text_embd: int, n_embd: int, n_ff: int, n_layer: int,
                       n_head: int, n_mel: int) -> None:
    ca, clip = Keys.ClipAudio, Keys.Clip
    spec.metadata.update({
        clip.PROJECTOR_TYPE: projector, clip.HAS_AUDIO_ENCODER: True,
        ca.EMBEDDING_LENGTH: n_embd, ca.FEED_FORWARD_LENGTH: n_ff, ca.BLOCK_COUNT: n_layer,
        ca.PROJECTION_DIM: n_text_embd, ca.Attention.HEAD_COUNT: n_head, ca.Attention.LAYERNORM_EPS: 1e-6,
        ca.NUM_MEL_BINS: n_mel,
    })


def gemma4a_mmproj_spec(*, n_text_embd: int = 640, n_layer: int = 12, n_embd: int = 1024, n_head: int = 8,
                        n_mel: int = 128, channels: tuple[int, int] = (128, 32), out_dims: int = 1536,
                        clipped: bool = False, weight_type: Q = Q.F16) -> ModelSpec:
    """Gemma 4's audio conformer (E2B/E4B audio_config: hidden 1024, 12 layers, 8 heads, FFN 4 x 1024,
    subsampling channels 128 and 32, output_proj_dims 1536, 128 mel bins, conv kernel 5) as
    conversion/gemma.py Gemma4VisionAudioModel writes it and clip.cpp's GEMMA4A loader reads it, alone in
    its file: a.conv1d.{0,1} (F32 conv kernels, as the converter forces for audio convs) with their
    LayerNorm weights, a.input_projection (F32: its HF name carries "_conv"), per layer the two half-step
    FFNs with pre/post norms, attn_pre_norm, q/k/v/out, attn_k_rel, per_dim_scale and per_dim_k_scale
    (softplus'ed, F32), attn_post_norm, the light conv (conv_norm, conv_pw1 {n, 2n}, conv_dw [5, n] F32,
    norm_conv, conv_pw2) and ln2; a.pre_encode.out {n, out_dims} with its bias and mm.a.input_projection
    {out_dims, n_text}; with `clipped`, each loaded weight's four clamp scalars."""
    spec = ModelSpec(CLIP_ARCH)
    _gemma4_audio_meta(spec, VisionProjectorType.GEMMA4A, n_text_embd, n_embd, 4 * n_embd, n_layer, n_head, n_mel)
    add = spec.tensors.append
    f32, d_head, c0, c1 = Q.F32, n_embd // n_head, channels[0], channels[1]
    add(("a.conv1d.0.weight", f32, (3, 3, 1, c0)))
    add(("a.conv1d.0.norm.weight", f32, (c0,)))
    add(("a.conv1d.1.weight", f32, (3, 3, c0, c1)))
    add(("a.conv1d.1.norm.weight", f32, (c1,)))
    add(("a.input_projection.weight", f32, (c1 * (n_mel // 4), n_embd)))
    for i in range(n_layer):
        p = f"a.blk.{i}."
        for sfx in ("", "_1"):
            add((f"{p}ffn_norm{sfx}.weight", f32, (n_embd,)))
            add((f"{p}ffn_up{sfx}.weight", weight_type, (n_embd, 4 * n_embd)))
            add((f"{p}ffn_down{sfx}.weight", weight_type, (4 * n_embd, n_embd)))
            add((f"{p}ffn_post_norm{sfx}.weight", f32, (n_embd,)))
        add((p + "attn_pre_norm.weight", f32, (n_embd,)))
        for kind in ("attn_q", "attn_k", "attn_v", "attn_out", "attn_k_rel"):
            add((f"{p}{kind}.weight", weight_type, (n_embd, n_embd)))
        add((p + "per_dim_scale.weight", f32, (d_head,)))
        add((p + "per_dim_k_scale.weight", f32, (d_head,)))
        add((p + "attn_post_norm.weight", f32, (n_embd,)))
        add((p + "conv_norm.weight", f32, (n_embd,)))
        add((p + "conv_pw1.weight", weight_type, (n_embd, 2 * n_embd)))
        add((p + "conv_dw.weight", f32, (5, n_embd)))
        add((p + "norm_conv.weight", f32, (n_embd,)))
        add((p + "conv_pw2.weight", weight_type, (n_embd, n_embd)))
        add((p + "ln2.weight", f32, (n_embd,)))
    add(("a.pre_encode.out.weight", weight_type, (n_embd, out_dims)))
    add(("a.pre_encode.out.bias", f32, (out_dims,)))
    spec.add(T.A_MM_INP_PROJ, weight_type, (out_dims, n_text_embd))
    if clipped:
        for t, _, _ in list(spec.tensors):
            if t.endswith(".weight") and t != "a.conv1d.0.norm.weight":
                for suffix in GEMMA4_CLAMP_SUFFIXES:
                    add((t.removesuffix("weight") + suffix, f32, (1,)))
    return spec


def gemma4ua_mmproj_spec(*, n_text_embd: int = 640, frame: int = 640) -> ModelSpec:
    """The unified Gemma 4 models' encoder-free audio embedder alone in its file: mm.a.input_projection
    from 640-sample frames to the text width (audio_embed_dim is the frame)."""
    spec = ModelSpec(CLIP_ARCH)
    _gemma4_audio_meta(spec, "gemma4ua", n_text_embd, frame, 0, 0, 0, frame)
    spec.add(T.A_MM_INP_PROJ, Q.F16, (frame, n_text_embd))
    return spec


def gemma4_e4b_mmproj_spec(*, n_text_embd: int = 640, n_layer: int = 16, n_audio_layer: int = 12) -> ModelSpec:
    """Gemma 4 E4B's mmproj as the converter writes it: the vision tower (gemma4v) and the audio conformer
    (gemma4a) in one file, typed by clip.vision.projector_type and clip.audio.projector_type (no
    clip.projector_type), both encoders flagged; llama-server loads them as two contexts."""
    vision = gemma4v_mmproj_spec(n_text_embd=n_text_embd, n_layer=n_layer)
    sound = gemma4a_mmproj_spec(n_text_embd=n_text_embd, n_layer=n_audio_layer)
    spec = ModelSpec(CLIP_ARCH)
    spec.metadata.update({**vision.metadata, **sound.metadata})
    del spec.metadata[Keys.Clip.PROJECTOR_TYPE]
    spec.metadata.update({Keys.ClipVision.PROJECTOR_TYPE: VisionProjectorType.GEMMA4V,
                          Keys.ClipAudio.PROJECTOR_TYPE: VisionProjectorType.GEMMA4A,
                          Keys.Clip.HAS_VISION_ENCODER: True, Keys.Clip.HAS_AUDIO_ENCODER: True})
    spec.tensors = vision.tensors + sound.tensors
    return spec


# --- projb: the audio encoders (tools/mtmd/models/whisper-enc.cpp, qwen3a.cpp) -----------------------
# Whisper-large-v3's encoder, which every whisper-enc type carries (HF WhisperConfig: d_model 1280,
# 32 encoder layers of 20 heads, encoder_ffn_dim 5120, 128 mel bins, 1500 source positions)
WHISPER_N_EMBD = 1280
WHISPER_N_FF = 5120
WHISPER_N_HEAD = 20
WHISPER_N_LAYER = 32
WHISPER_N_MEL = 128
WHISPER_N_POS = 1500


def _whisper(projector: str, n_text_embd: int, n_layer: int, stack_factor: int | None,
             conv_type: Q = Q.F16, n_embd: int = WHISPER_N_EMBD, n_ff: int = WHISPER_N_FF,
             n_head: int = WHISPER_N_HEAD, weight_type: Q = Q.F16) -> ModelSpec:
    """The Whisper encoder as conversion/ultravox.py writes it: clip.audio.* keys, two conv1d (F16
    kernels {3, in, out}, biases {1, out}), an F32 position table, layers with biased q/v/out and no k
    bias, biased layer norms, an FFN fc1 -> ffn_up, fc2 -> ffn_down, the post layer norm."""
    spec = _audio_spec(projector, n_text_embd=n_text_embd, n_embd=n_embd, n_ff=n_ff, n_layer=n_layer, n_head=n_head,
                       eps=1e-5)
    if stack_factor is not None:
        spec.metadata[Keys.ClipAudio.Projector.STACK_FACTOR] = stack_factor
    spec.add(T.A_ENC_CONV1D, conv_type, (3, WHISPER_N_MEL, n_embd), 1)
    spec.add(T.A_ENC_CONV1D, Q.F32, (1, n_embd), 1, "bias")
    spec.add(T.A_ENC_CONV1D, conv_type, (3, n_embd, n_embd), 2)
    spec.add(T.A_ENC_CONV1D, Q.F32, (1, n_embd), 2, "bias")
    spec.add(T.A_ENC_EMBD_POS, Q.F32, (n_embd, WHISPER_N_POS))    # base.py keeps A_ENC_EMBD_POS in F32
    for i in range(n_layer):
        for kind in (T.A_ENC_ATTN_Q, T.A_ENC_ATTN_K, T.A_ENC_ATTN_V, T.A_ENC_OUTPUT):
            _linear(spec, kind, i, n_embd, n_embd, kind is not T.A_ENC_ATTN_K, weight_type)
        for kind in (T.A_ENC_INPUT_NORM, T.A_ENC_OUTPUT_NORM):
            _layer_norm(spec, kind, n_embd, i)
        _linear(spec, T.A_ENC_FFN_UP, i, n_embd, n_ff, True, weight_type)
        _linear(spec, T.A_ENC_FFN_DOWN, i, n_ff, n_embd, True, weight_type)
    _layer_norm(spec, T.A_POST_NORM, n_embd)
    return spec


def ultravox_mmproj_spec(*, n_text_embd: int = 2048, n_layer: int = WHISPER_N_LAYER, stack_factor: int = 8,
                         n_hidden: int = 4096) -> ModelSpec:
    """Ultravox's (ultravox) projector: the Whisper encoder, frames stacked by 8, RMS norm, mm.a.mlp.1
    {n_embd x 8, n_hidden}, SwiGLU halving it, RMS norm, mm.a.mlp.2 {n_hidden / 2, n_text}, no biases —
    ultravox-v0_5-llama-3_2-1b's shape."""
    spec = _whisper(VisionProjectorType.ULTRAVOX, n_text_embd, n_layer, stack_factor)
    stacked = WHISPER_N_EMBD * stack_factor
    spec.add(T.A_MM_NORM_PRE, Q.F32, (stacked,))
    _linear(spec, T.A_MMPROJ, 1, stacked, n_hidden, False)
    spec.add(T.A_MM_NORM_MID, Q.F32, (n_hidden // 2,))
    _linear(spec, T.A_MMPROJ, 2, n_hidden // 2, n_text_embd, False)
    return spec


def qwen2a_mmproj_spec(*, n_text_embd: int = 4096, n_layer: int = WHISPER_N_LAYER) -> ModelSpec:
    """Qwen2-Audio's (qwen2a) projector: the Whisper encoder, pooled by 2, one biased linear layer
    mm.a.fc {n_embd, n_text} — Qwen2-Audio-7B's shape."""
    spec = _whisper(VisionProjectorType.QWEN2A, n_text_embd, n_layer, None)
    _linear(spec, T.A_MMPROJ_FC, None, WHISPER_N_EMBD, n_text_embd, True)
    return spec


def voxtral_mmproj_spec(*, n_text_embd: int = 3072, n_layer: int = WHISPER_N_LAYER) -> ModelSpec:
    """Voxtral's (voxtral) projector: the Whisper encoder, pooled by 2 and stacked by 4, mm.a.mlp.1
    {n_embd x 4, n_text} and mm.a.mlp.2 {n_text, n_text} without biases — Voxtral-Mini-3B's shape."""
    spec = _whisper(VisionProjectorType.VOXTRAL, n_text_embd, n_layer, 4)
    _linear(spec, T.A_MMPROJ, 1, WHISPER_N_EMBD * 4, n_text_embd, False)
    _linear(spec, T.A_MMPROJ, 2, n_text_embd, n_text_embd, False)
    return spec


def musicflamingo_mmproj_spec(*, n_text_embd: int = 3584, n_layer: int = WHISPER_N_LAYER) -> ModelSpec:
    """Music Flamingo's (musicflamingo) projector: the Whisper encoder with F32 conv kernels (the
    converter's tensor_force_quant), pooled by 2, a biased two-layer GELU MLP {n_embd, n_text},
    {n_text, n_text} — music-flamingo's Qwen2.5-7B width."""
    spec = _whisper(VisionProjectorType.MUSIC_FLAMINGO, n_text_embd, n_layer, None, conv_type=Q.F32)
    _linear(spec, T.A_MMPROJ, 1, WHISPER_N_EMBD, n_text_embd, True)
    _linear(spec, T.A_MMPROJ, 2, n_text_embd, n_text_embd, True)
    return spec


def meralion_mmproj_spec(*, n_text_embd: int = 3584, n_layer: int = WHISPER_N_LAYER, stack_factor: int = 15,
                         n_hidden: int = 6400) -> ModelSpec:
    """MERaLiON-2's (meralion) projector: the Whisper encoder, frames stacked by 15, a layer norm
    (ln_speech) and the biased adaptor mm.a.mlp.0 {19200, 6400} + SiLU, mlp.1 / mlp.2 {6400, 6400}
    (gate and pool), mlp.3 {6400, n_text} — MERaLiON-2-10B's shape."""
    spec = _whisper(VisionProjectorType.MERALION, n_text_embd, n_layer, stack_factor)
    stacked = WHISPER_N_EMBD * stack_factor
    _linear(spec, T.A_MMPROJ, 0, stacked, n_hidden, True)
    _linear(spec, T.A_MMPROJ, 1, n_hidden, n_hidden, True)
    _linear(spec, T.A_MMPROJ, 2, n_hidden, n_hidden, True)
    _linear(spec, T.A_MMPROJ, 3, n_hidden, n_text_embd, True)
    _layer_norm(spec, T.A_MM_NORM_PRE, stacked)
    return spec


def glma_mmproj_spec(*, n_text_embd: int = 2048, n_layer: int = WHISPER_N_LAYER, stack_factor: int = 4,
                     n_hidden: int = 4096) -> ModelSpec:
    """GLM-ASR's (glma) projector: the Whisper encoder, a layer norm, frames stacked by 4 (merge_factor),
    a biased GELU MLP mm.a.mlp.1 {n_embd x 4, 4096} / mlp.2 {4096, n_text}, and the begin/end-of-audio
    embeddings (v.boi, v.eoi) — GLM-ASR-Nano-2512's shape."""
    spec = _whisper(VisionProjectorType.GLMA, n_text_embd, n_layer, stack_factor)
    _linear(spec, T.A_MMPROJ, 1, WHISPER_N_EMBD * stack_factor, n_hidden, True)
    _linear(spec, T.A_MMPROJ, 2, n_hidden, n_text_embd, True)
    _layer_norm(spec, T.A_MM_NORM_PRE, WHISPER_N_EMBD)
    spec.tensors += [("v.boi", Q.F32, (n_text_embd,)), ("v.eoi", Q.F32, (n_text_embd,))]
    return spec


def qwen3a_mmproj_spec(*, n_text_embd: int = 2048, n_layer: int = 24, n_embd: int = 1024, n_ff: int = 4096,
                       n_head: int = 16, n_conv: int = 480) -> ModelSpec:
    """Qwen3-ASR's (qwen3a) projector as conversion/qwen3vl.py writes it (an audio-only file: the type in
    clip.audio.projector_type): three stride-2 conv2d {3, 3, in, 480} (F16, biases {1, 1, 480}),
    conv_out {480 x 16, n_embd} without a bias, the sinusoidal position table {n_embd, 1500} (F32), layers
    with biased q/k/v/out, biased layer norms and a GELU FFN, the post norm, and the biased MLP
    mm.a.mlp.1 {n_embd, n_embd} / mlp.2 {n_embd, n_text} — Qwen3-ASR-1.7B's shape."""
    spec = _whisper(VisionProjectorType.QWEN3A, n_text_embd, n_layer, None, n_embd=n_embd, n_ff=n_ff,
                    n_head=n_head)
    del spec.metadata[Keys.Clip.PROJECTOR_TYPE]
    spec.metadata[Keys.ClipAudio.PROJECTOR_TYPE] = VisionProjectorType.QWEN3A
    spec.tensors = [t for t in spec.tensors if not t[0].startswith("a.conv1d.")]
    for i in range(n_layer):
        spec.add(T.A_ENC_ATTN_K, Q.F32, (n_embd,), i, "bias")
    for i, ic in ((1, 1), (2, n_conv), (3, n_conv)):
        spec.add(T.A_ENC_CONV2D, Q.F16, (3, 3, ic, n_conv), i)
        spec.add(T.A_ENC_CONV2D, Q.F32, (1, 1, n_conv), i, "bias")
    spec.add(T.A_ENC_CONV_OUT, Q.F16, (n_conv * (WHISPER_N_MEL // 8), n_embd))
    _linear(spec, T.A_MMPROJ, 1, n_embd, n_embd, True)
    _linear(spec, T.A_MMPROJ, 2, n_embd, n_text_embd, True)
    return spec


# --- projb: MiniCPM-V's resampler (tools/mtmd/models/minicpmv.cpp) -----------------------------------

def minicpmv_mmproj_spec(*, n_text_embd: int = 3584, n_layer: int = 27, version: int = 3, query_num: int = 64,
                         image_size: int = 448, n_pos_table: int = 70 * 70) -> ModelSpec:
    """MiniCPM-V's (resampler) projector as tools/mtmd/legacy-models/minicpmv-convert-image-encoder-to-gguf.py
    writes it: SigLIP-So400m/14 (27 layers, image_size 448, a 70 x 70 position table in F16, the FFN
    named fc1 -> ffn_down), and the resampler of width n_text (64 queries, heads of 128): query and
    pos_embed_k F32 (not ".weight"), kv {1152, n_text}, attn.q/k/v/out and proj {n_text, n_text} F16,
    their biases and ln_q / ln_kv / ln_post F32 — MiniCPM-V 2.6's shape (version 3, Qwen2-7B's 3584)."""
    spec = _siglip("resampler", 0, n_layer, SIGLIP_N_EMBD, SIGLIP_N_FF, SIGLIP_N_HEAD, image_size,
                   SIGLIP_PATCH_SIZE, Q.F16, Q.F16)
    spec.metadata.update({"clip.minicpmv_version": Typed(version, GGUFValueType.INT32),   # get_i32
                          "clip.minicpmv_query_num": query_num,
                          "clip.has_minicpmv_projector": True})
    spec.tensors = [t for t in spec.tensors if not t[0].startswith("v.position_embd")]
    spec.add(T.V_ENC_EMBD_POS, Q.F16, (SIGLIP_N_EMBD, n_pos_table))
    d = n_text_embd
    spec.tensors += [("resampler.pos_embed_k", Q.F32, (d, n_pos_table)), ("resampler.query", Q.F32, (d, query_num)),
                     ("resampler.proj.weight", Q.F16, (d, d)), ("resampler.kv.weight", Q.F16, (SIGLIP_N_EMBD, d))]
    for part in ("q", "k", "v", "out"):
        spec.tensors += [(f"resampler.attn.{part}.weight", Q.F16, (d, d)), (f"resampler.attn.{part}.bias", Q.F32, (d,))]
    for part in ("q", "kv", "post"):
        spec.tensors += [(f"resampler.ln_{part}.weight", Q.F32, (d,)), (f"resampler.ln_{part}.bias", Q.F32, (d,))]
    return spec


# --- projb: Kimi-VL's and Kimi-K2.5's MoonViT (tools/mtmd/models/kimivl.cpp, kimik25.cpp) ---------------

def _moonvit(projector: str, n_text_embd: int, n_layer: int, fused_qkv: bool, pos_shape: tuple[int, ...],
             eps: float) -> ModelSpec:
    """MoonViT as conversion/kimivl.py writes it: SigLIP-So400m's sizes (1152, 4304, 16 heads, patch 14),
    image_size 64 x 14, a GELU FFN fc0 -> ffn_up, fc1 -> ffn_down, biased layer norms and attention
    (split q/k/v for Kimi-VL, wqkv for K2.5), final_layernorm -> v.post_ln, merge by 2, and the
    projector: pre_norm {1152}, linear_1 {4608, 4608}, linear_2 {4608, n_text}, all with biases."""
    e, ff, merged = SIGLIP_N_EMBD, SIGLIP_N_FF, SIGLIP_N_EMBD * 4
    cv = Keys.ClipVision
    spec = _vision_spec(projector, cv.USE_GELU, n_text_embd=n_text_embd, n_embd=e, n_ff=ff, n_layer=n_layer,
                        n_head=SIGLIP_N_HEAD, eps=eps, image_size=64 * 14, patch_size=14, mean=[0.5, 0.5, 0.5],
                        std=[0.5, 0.5, 0.5], **{cv.Projector.SCALE_FACTOR: 2})
    spec.add(T.V_ENC_EMBD_PATCH, Q.F16, (14, 14, 3, e))
    spec.add(T.V_ENC_EMBD_PATCH, Q.F32, (e,), suffix="bias")
    spec.add(T.V_ENC_EMBD_POS, Q.F32, pos_shape)        # base.py keeps V_ENC_EMBD_POS in F32
    for i in range(n_layer):
        for kind in (T.V_ENC_INPUT_NORM, T.V_ENC_POST_ATTN_NORM):
            _layer_norm(spec, kind, e, i)
        if fused_qkv:
            _linear(spec, T.V_ENC_ATTN_QKV, i, e, 3 * e, True)
        else:
            for kind in (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V):
                _linear(spec, kind, i, e, e, True)
        _linear(spec, T.V_ENC_ATTN_O, i, e, e, True)
        _linear(spec, T.V_ENC_FFN_UP, i, e, ff, True)
        _linear(spec, T.V_ENC_FFN_DOWN, i, ff, e, True)
    _layer_norm(spec, T.V_POST_NORM, e)
    _layer_norm(spec, T.V_MM_INP_NORM, e)
    _linear(spec, T.V_MMPROJ, 1, merged, merged, True)
    _linear(spec, T.V_MMPROJ, 2, merged, n_text_embd, True)
    return spec


def kimivl_mmproj_spec(*, n_text_embd: int = 2048, n_layer: int = 27) -> ModelSpec:
    """Kimi-VL's (kimivl) projector: the 64 x 64 position table flattened to {1152, 4096}, split q/k/v,
    eps 1e-5 — Kimi-VL-A3B's shape (Moonlight's 2048)."""
    return _moonvit(VisionProjectorType.KIMIVL, n_text_embd, n_layer, False, (SIGLIP_N_EMBD, 64 * 64), 1e-5)


def kimik25_mmproj_spec(*, n_text_embd: int = 7168, n_layer: int = 27, patch_limit: int | None = 16384) -> ModelSpec:
    """Kimi-K2.5's (kimik25) projector: the 3-D position table {1152, 64, 64}, a fused qkv, the
    preprocessor's 8 .. in_patch_limit patches as clip.vision.image_min/max_pixels (None: the keys left
    out) — Kimi-K2.5's shape (DeepSeek-V3's 7168)."""
    spec = _moonvit(VisionProjectorType.KIMIK25, n_text_embd, n_layer, True, (SIGLIP_N_EMBD, 64, 64), 1e-5)
    if patch_limit is not None:
        spec.metadata[Keys.ClipVision.IMAGE_MIN_PIXELS] = 8 * 14 * 14
        spec.metadata[Keys.ClipVision.IMAGE_MAX_PIXELS] = patch_limit * 14 * 14
    return spec


# --- projb: LFM2-Audio's FastConformer (tools/mtmd/models/conformer.cpp) ----------------------------------

def lfm2a_mmproj_spec(*, n_text_embd: int = 2048, n_layer: int = 17, n_embd: int = 512, n_head: int = 8,
                      n_ff: int = 2048, n_sub: int = 256, kernel: int = 9, n_audio_vocab: int = 2049 * 8) -> ModelSpec:
    """LFM2-Audio's (lfm2a) projector, the tensors clip.cpp loads as conversion/lfm2.py and gemma.py's
    ConformerAudioModel write them: canary-180m-flash's FastConformer (17 layers of 512, 8 heads, FFN
    2048, 128 mel bins, 256 subsampling channels, a depthwise kernel of 9), convolutions in F32
    (tensor_force_quant), pre-encode biases {1, 1, 256}, the audio-output embedding {n_text, 2049 x 8}
    as a.position_embd (F32: clip_n_mmproj_embd reads the text width from it), and the adapter
    mm.a.mlp.0 (norm), .1 {512, n_text}, .3 {n_text, n_text} — LFM2-Audio-1.5B's shape (LFM2-1.2B's 2048).
    The output-side tensors the converter also writes (a.position_embd_norm, a.embd_to_logits) are
    not loaded by clip.cpp and left out."""
    spec = _audio_spec(VisionProjectorType.LFM2A, n_text_embd=n_text_embd, n_embd=n_embd, n_ff=n_embd, n_layer=n_layer,
                       n_head=n_head, eps=1e-5)
    spec.add(T.A_ENC_EMBD_POS, Q.F32, (n_text_embd, n_audio_vocab))
    for i, shape in ((0, (3, 3, 1, n_sub)), (2, (3, 3, 1, n_sub)), (3, (1, 1, n_sub, n_sub)), (5, (3, 3, 1, n_sub)),
                     (6, (1, 1, n_sub, n_sub))):
        spec.add(T.A_ENC_CONV1D, Q.F32, shape, i)
        spec.add(T.A_ENC_CONV1D, Q.F32, (1, 1, n_sub), i, "bias")
    _linear(spec, T.A_ENC_OUT, None, n_sub * (WHISPER_N_MEL // 8), n_embd, True)
    for i in range(n_layer):
        for kind in (T.A_ENC_FFN_NORM, T.A_ENC_INPUT_NORM, T.A_ENC_NORM_CONV, T.A_ENC_FFN_NORM_1,
                     T.A_ENC_OUTPUT_NORM, T.A_ENC_CONV_NORM):
            _layer_norm(spec, kind, n_embd, i)
        _linear(spec, T.A_ENC_FFN_UP, i, n_embd, n_ff, True)
        _linear(spec, T.A_ENC_FFN_DOWN, i, n_ff, n_embd, True)
        _linear(spec, T.A_ENC_FFN_UP_1, i, n_embd, n_ff, True)
        _linear(spec, T.A_ENC_FFN_DOWN_1, i, n_ff, n_embd, True)
        for kind in (T.A_ENC_ATTN_Q, T.A_ENC_ATTN_K, T.A_ENC_ATTN_V, T.A_ENC_OUTPUT):
            _linear(spec, kind, i, n_embd, n_embd, True)
        spec.add(T.A_ENC_POS_BIAS_U, Q.F32, (n_embd // n_head, n_head), i, None)
        spec.add(T.A_ENC_POS_BIAS_V, Q.F32, (n_embd // n_head, n_head), i, None)
        spec.add(T.A_ENC_LINEAR_POS, Q.F16, (n_embd, n_embd), i)
        _linear(spec, T.A_ENC_CONV_PW1, i, n_embd, 2 * n_embd, True, Q.F32)
        spec.add(T.A_ENC_CONV_DW, Q.F32, (kernel, n_embd), i)
        spec.add(T.A_ENC_CONV_DW, Q.F32, (n_embd,), i, "bias")
        _linear(spec, T.A_ENC_CONV_PW2, i, n_embd, n_embd, True, Q.F32)
    _layer_norm(spec, T.A_MMPROJ, n_embd, 0)
    _linear(spec, T.A_MMPROJ, 1, n_embd, n_text_embd, True)
    _linear(spec, T.A_MMPROJ, 3, n_text_embd, n_text_embd, True)
    return spec


def paddleocr_mmproj_spec(*, n_text_embd: int = 1024, n_layer: int = 27, min_pixels: int = 147384,
                          max_pixels: int = 2822400) -> ModelSpec:
    """PaddleOCR-VL's (paddleocr) projector as conversion/ernie.py writes it: its SigLIP NaViT (1152,
    4304, 27 layers, 16 heads, patch 14, a 27 x 27 position table in F32, fc1 -> ffn_up, eps 1e-6),
    image_size sqrt(max_pixels), the preprocessor's pixel limits, and mlp_AR: pre_norm {1152},
    linear_1 {4608, 4608}, linear_2 {4608, n_text} with biases — PaddleOCR-VL-0.9B's shape (ERNIE-4.5-0.3B's
    1024)."""
    spec = _moonvit(VisionProjectorType.PADDLEOCR, n_text_embd, n_layer, False, (SIGLIP_N_EMBD, 27 * 27), 1e-6)
    cv = Keys.ClipVision
    del spec.metadata[cv.Projector.SCALE_FACTOR]
    spec.metadata.update({cv.IMAGE_SIZE: math.isqrt(max_pixels), cv.IMAGE_MIN_PIXELS: min_pixels,
                          cv.IMAGE_MAX_PIXELS: max_pixels})
    return spec


# --- projb: LLaVA's MLP (tools/mtmd/models/llava.cpp) ----------------------------------------------------

def llava_mmproj_spec(*, n_text_embd: int = 4096, n_layer: int = 23, n_embd: int = 1024, n_ff: int = 4096,
                      n_head: int = 16, image_size: int = 336, patch_size: int = 14) -> ModelSpec:
    """LLaVA 1.5's (mlp) projector as tools/mtmd/legacy-models/convert_image_encoder_to_gguf.py writes it:
    CLIP ViT-L/14 at 336 px with its last layer dropped (block_count 23), quick GELU, the class
    embedding and a 577-row position table (F16: a 2-D ".weight"), no patch bias, the pre-norm and no
    post-norm, the FFN named fc1 -> ffn_down, and mm.0 {1024, 4096} / mm.2 {4096, n_text} with biases —
    llava-v1.5-7b's shape."""
    cv, clip = Keys.ClipVision, Keys.Clip
    spec = ModelSpec(CLIP_ARCH)
    spec.metadata.update({
        clip.PROJECTOR_TYPE: "mlp", clip.HAS_VISION_ENCODER: True, "clip.has_llava_projector": True,
        cv.USE_GELU: False, cv.EMBEDDING_LENGTH: n_embd, cv.FEED_FORWARD_LENGTH: n_ff, cv.BLOCK_COUNT: n_layer,
        cv.PROJECTION_DIM: 768, cv.Attention.HEAD_COUNT: n_head, cv.Attention.LAYERNORM_EPS: 1e-5,
        cv.IMAGE_SIZE: image_size, cv.PATCH_SIZE: patch_size,
        cv.IMAGE_MEAN: [0.48, 0.46, 0.41], cv.IMAGE_STD: [0.27, 0.26, 0.28],
    })
    spec.tensors.append(("v.class_embd", Q.F32, (n_embd,)))
    spec.add(T.V_ENC_EMBD_PATCH, Q.F16, (patch_size, patch_size, 3, n_embd))
    spec.add(T.V_ENC_EMBD_POS, Q.F16, (n_embd, (image_size // patch_size) ** 2 + 1))
    _layer_norm(spec, T.V_PRE_NORM, n_embd)
    for i in range(n_layer):     # fc1 -> ffn_down, as the legacy converter names it
        _vit_layer(spec, i, n_embd, n_ff, Q.F16, T.V_ENC_FFN_DOWN, T.V_ENC_FFN_UP)
    _linear(spec, T.V_MMPROJ, 0, n_embd, n_text_embd, True)
    _linear(spec, T.V_MMPROJ, 2, n_text_embd, n_text_embd, True)
    return spec


def lightonocr_mmproj_spec(*, n_text_embd: int = 1024, n_layer: int = 24) -> ModelSpec:
    """LightOnOCR's (lightonocr) projector: Mistral Small 3.1's Pixtral tower and patch merger (as
    pixtral_mmproj_spec) without the [IMG_BREAK] embedding (conversion/lighton_ocr.py: use_break_tok
    False) — LightOnOCR-1B's shape (Qwen3-0.6B's 1024)."""
    spec = pixtral_mmproj_spec(n_text_embd=n_text_embd, n_layer=n_layer)
    spec.metadata[Keys.Clip.PROJECTOR_TYPE] = VisionProjectorType.LIGHTONOCR
    spec.tensors = [t for t in spec.tensors if t[0] != "v.token_embd.img_break"]
    return spec
