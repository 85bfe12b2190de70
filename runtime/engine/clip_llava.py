"""LLaVA's projector (PROJECTOR_TYPE_MLP: LLaVA 1.5 / 1.6, BakLLaVA, ShareGPT4V...), as clip.cpp builds it
at the warmup image (tools/mtmd/models/llava.cpp clip_graph_llava::build).

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd):
- clip.cpp load_hparams (MLP): the warmup image is image_size square (image_grid_pinpoints change only
  the preprocessor); no explicit feature layers are modelled (granite-vision's stack is refused).
- clip.cpp load_tensors: the generic CLIP tower (a class embedding, the FFN named fc1 -> ffn_down as the
  legacy converter writes it: MLP is in is_ffn_swapped), mm.0 and mm.2 with biases, an optional
  v.image_newline; mm.3 turns the type into MLP_NORM (not modelled); clip_n_mmproj_embd: mm.2's ne[1].
- llava.cpp: build_inp, the class embedding concatenated after the patches, the positions gathered
  with get_rows, the pre-norm, the layers below the last one (il_last = n_layer - 1: the legacy
  converter already dropped the tower's last layer, and one more loaded layer is never run), the
  post-norm where present, then the patches picked (get_rows by patch ids: the class token dropped)
  and the GELU MLP.
"""
from __future__ import annotations

from collections.abc import Mapping

from gguf import MODEL_TENSOR, Keys

from planner.core.errors import BadInput
from planner.gguf.reader import ModelFile
from runtime.engine.clip import SiglipGraph
from runtime.engine.clip_hparams import (
    ClipHParams,
    SiglipHead,
    UnsupportedProjector,
    ffn_unary,
    name,
    reading_keys,
    tower_figures,
)
from runtime.ggml import build as g
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor, TensorFlag

T = MODEL_TENSOR
CV = Keys.ClipVision
LLAVA_MLP = "mlp"                 # PROJECTOR_TYPE_NAMES[PROJECTOR_TYPE_MLP]
CLASS_EMBD = "v.class_embd"       # clip-impl.h TN_CLASS_EMBD
IMAGE_NEWLINE = "v.image_newline"  # clip-impl.h TN_IMAGE_NEWLINE
FEATURE_LAYERS = "clip.vision.feature_layer"   # clip-impl.h KEY_FEATURE_LAYERS


def read_llava_hparams(model: ModelFile) -> ClipHParams:
    meta = model.metadata
    out = model.tensor(name(T.V_MMPROJ, 2))
    if out is None or not meta.get(Keys.Clip.HAS_VISION_ENCODER):
        raise BadInput(f"{model.path}: an mlp projector without a vision encoder or {name(T.V_MMPROJ, 2)}")
    if model.tensor(name(T.V_MMPROJ, 3)) is not None:
        raise UnsupportedProjector(model.path, "mlp with mm.3 (MLP_NORM, Yi-VL)")
    if meta.get(FEATURE_LAYERS):
        raise UnsupportedProjector(model.path, "mlp with explicit feature layers (granite-vision)")
    with reading_keys(model):
        image = int(meta[CV.IMAGE_SIZE])
        return ClipHParams(LLAVA_MLP, **tower_figures(meta), image_size=image, patch_size=int(meta[CV.PATCH_SIZE]),
                           n_merge=1, ffn_op=ffn_unary(meta), n_mmproj_embd=out.shape[1], warmup_image_size=image)


_LAYER = (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V, T.V_ENC_ATTN_O, T.V_ENC_INPUT_NORM,
          T.V_ENC_POST_ATTN_NORM, T.V_ENC_FFN_UP, T.V_ENC_FFN_GATE, T.V_ENC_FFN_DOWN)


def llava_tensor_names(hp: ClipHParams) -> list[str]:
    names = [name(k, None, s) for k in (T.V_ENC_EMBD_PATCH, T.V_PRE_NORM, T.V_POST_NORM) for s in ("weight", "bias")]
    names += [name(T.V_ENC_EMBD_POS), CLASS_EMBD, IMAGE_NEWLINE]
    names += [name(k, il, s) for il in range(hp.n_layer) for k in _LAYER for s in ("weight", "bias")]
    return names + [name(T.V_MMPROJ, i, s) for i in (0, 2) for s in ("weight", "bias")]


class LlavaGraph(SiglipGraph):
    """clip_graph_llava::build with the MLP projector."""

    def __init__(self, hp: ClipHParams, w: Mapping[str, Tensor], flash_attn: bool) -> None:
        super().__init__(hp, w, flash_attn)
        self.head = SiglipHead((), "", 0, 1, True)        # is_ffn_swapped lists MLP
        self.n_patches = hp.n_patches_side ** 2
        self.n_pos = self.n_patches + (1 if CLASS_EMBD in w else 0)

    def vit(self, x: Tensor) -> Tensor:
        hp = self.hp
        cls = self.w.get(CLASS_EMBD)
        if cls is not None:       # ggml_concat along dim 1: the class token after the patches
            x = Tensor(x.type, (x.ne[0], x.ne[1] + 1, x.ne[2], 1), op=Op.CONCAT, src=[x, cls], op_params={"dim": 1})
        positions = g.new_tensor(GGMLType.I32, (self.n_pos,), "positions", TensorFlag.INPUT)
        x = g.add(x, g.get_rows(self.w[name(T.V_ENC_EMBD_POS)], positions))
        if self._opt(name(T.V_PRE_NORM)) is not None:
            x = self.norm(x, T.V_PRE_NORM)
        for il in range(hp.n_layer - 1):
            x = g.add(self.attention(self.norm(x, T.V_ENC_INPUT_NORM, il), il), x)
            x = g.add(x, self.ffn(self.norm(x, T.V_ENC_POST_ATTN_NORM, il), il))
        if self._opt(name(T.V_POST_NORM)) is not None:
            x = self.norm(x, T.V_POST_NORM)
        return x

    def build(self) -> Graph:
        x = self.vit(self.inp())
        x = g.reshape(x, (x.ne[0], x.ne[1]))
        patches = g.new_tensor(GGMLType.I32, (self.n_patches,), "patches", TensorFlag.INPUT)
        x = g.get_rows(x, patches)
        x = g.unary(self.linear(x, self.w[name(T.V_MMPROJ, 0)], self._opt(name(T.V_MMPROJ, 0, "bias"))), "GELU")
        self.graph.expand(self.linear(x, self.w[name(T.V_MMPROJ, 2)], self._opt(name(T.V_MMPROJ, 2, "bias"))))
        return self.graph
