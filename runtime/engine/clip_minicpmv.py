"""MiniCPM-V's projector (PROJECTOR_TYPE_MINICPMV, clip.projector_type "resampler": MiniCPM-V 2.5 / 2.6 /
4.x, MiniCPM-o), as clip.cpp builds it at the warmup image (tools/mtmd/models/minicpmv.cpp
clip_graph_minicpmv::build).

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd):
- clip.cpp load_hparams: clip.minicpmv_version (default 2) and clip.minicpmv_query_num (64 for versions
  3..6 and 100045 when absent, else 96); no token limits, so the warmup image is image_size square.
- clip.cpp load_tensors: the SigLIP tower (the FFN named as the converter names it: MINICPMV is in
  is_ffn_swapped), and the resampler: pos_embed_k (loaded, never read), query, kv, attn.q/k/v/out with
  biases, ln_q / ln_kv / ln_post with biases, proj; clip_n_mmproj_embd: proj's ne[0].
- minicpmv.cpp: the learned positions picked by ggml_get_rows, build_vit with layer norms, then one
  cross-attention: the normed query against the normed kv projection of the patches, keys offset by
  2-D sin/cos positions built in the graph (omega repeated over the patches, times the row and column
  positions, sin and cos concatenated), heads of 128, the post norm and the square proj.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gguf import MODEL_TENSOR, Keys

from planner.core.errors import BadInput
from planner.gguf.reader import ModelFile
from runtime.engine.clip import SiglipGraph, attn_core
from runtime.engine.clip_hparams import (
    ClipHParams,
    SiglipHead,
    ffn_unary,
    name,
    reading_keys,
    required_tensor,
    tower_figures,
)
from runtime.ggml import build as g
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor, TensorFlag

T = MODEL_TENSOR
CV = Keys.ClipVision
# clip-impl.h: the GGUF keys and the resampler's tensor names (TN_MINICPMV_*; gguf-py spells the
# position table "pos_embd_k", the loader "pos_embed_k")
MINICPMV = "resampler"        # PROJECTOR_TYPE_NAMES[PROJECTOR_TYPE_MINICPMV]
KEY_MINICPMV_VERSION = "clip.minicpmv_version"
KEY_MINICPMV_QUERY_NUM = "clip.minicpmv_query_num"
POS_EMBED_K = "resampler.pos_embed_k"
QUERY = "resampler.query"
PROJ = "resampler.proj.weight"
KV_PROJ = "resampler.kv.weight"
RESAMPLER_D_HEAD = 128        # minicpmv.cpp: the resampler's attention heads are 128 wide
# load_hparams: the query count of files without clip.minicpmv_query_num, by version
_QUERY_NUM_64 = frozenset({3, 4, 5, 6, 100045})


def _attn(part: str, suffix: str) -> str:
    return f"resampler.attn.{part}.{suffix}"


def _ln(part: str, suffix: str) -> str:
    return f"resampler.ln_{part}.{suffix}"


RESAMPLER_TENSORS = (POS_EMBED_K, QUERY, PROJ, KV_PROJ,
                     *(_attn(p, s) for p in ("q", "k", "v", "out") for s in ("weight", "bias")),
                     *(_ln(p, s) for p in ("q", "kv", "post") for s in ("weight", "bias")))


@dataclass(frozen=True)
class MiniCPMVHParams(ClipHParams):
    query_num: int = 0
    version: int = 2


def read_minicpmv_hparams(model: ModelFile) -> MiniCPMVHParams:
    meta = model.metadata
    if not meta.get(Keys.Clip.HAS_VISION_ENCODER):
        raise BadInput(f"{model.path}: a resampler projector without clip.has_vision_encoder")
    proj = required_tensor(model, "resampler", PROJ)
    with reading_keys(model):
        version = int(meta.get(KEY_MINICPMV_VERSION, 0)) or 2
        query_num = int(meta.get(KEY_MINICPMV_QUERY_NUM, 0)) or (64 if version in _QUERY_NUM_64 else 96)
        image = int(meta[CV.IMAGE_SIZE])
        hp = MiniCPMVHParams(MINICPMV, **tower_figures(meta), image_size=image, patch_size=int(meta[CV.PATCH_SIZE]),
                             n_merge=1, ffn_op=ffn_unary(meta), n_mmproj_embd=proj.shape[0], warmup_image_size=image,
                             query_num=query_num, version=version)
    if hp.n_mmproj_embd % RESAMPLER_D_HEAD:
        raise BadInput(f"{model.path}: the resampler's width {hp.n_mmproj_embd} is not whole heads of "
                       f"{RESAMPLER_D_HEAD}")
    return hp


_LAYER = (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V, T.V_ENC_ATTN_O, T.V_ENC_INPUT_NORM,
          T.V_ENC_POST_ATTN_NORM, T.V_ENC_FFN_UP, T.V_ENC_FFN_GATE, T.V_ENC_FFN_DOWN, T.V_LAYER_SCALE_1,
          T.V_LAYER_SCALE_2)


def minicpmv_tensor_names(hp: ClipHParams) -> list[str]:
    names = [name(k, None, s) for k in (T.V_ENC_EMBD_PATCH, T.V_PRE_NORM, T.V_POST_NORM) for s in ("weight", "bias")]
    names += [name(T.V_ENC_EMBD_POS)]
    names += [name(k, il, s) for il in range(hp.n_layer) for k in _LAYER for s in ("weight", "bias")]
    return names + list(RESAMPLER_TENSORS)


class MiniCPMVGraph(SiglipGraph):
    """clip_graph_minicpmv::build: the SigLIP tower (positions gathered), then the resampler."""

    def __init__(self, hp: ClipHParams, w: Mapping[str, Tensor], flash_attn: bool) -> None:
        if not isinstance(hp, MiniCPMVHParams):
            raise TypeError("MiniCPMVGraph needs read_minicpmv_hparams' figures")
        super().__init__(hp, w, flash_attn)
        self.mini = hp
        self.head = SiglipHead((), "", 0, 1, True)      # is_ffn_swapped lists MINICPMV
        self.positions_in = g.new_tensor(GGMLType.I32, (self.n_pos,), "positions", TensorFlag.INPUT)

    def positions(self) -> Tensor | None:
        return g.get_rows(self.w[name(T.V_ENC_EMBD_POS)], self.positions_in)

    def _norm(self, x: Tensor, part: str) -> Tensor:
        x = Tensor(x.type, x.ne, op=Op.NORM, src=[x], op_params={"eps": self.hp.eps})
        return g.add(g.mul(x, self.w[_ln(part, "weight")]), self.w[_ln(part, "bias")])

    def _proj(self, x: Tensor, part: str) -> Tensor:
        return g.add(g.mul_mat(self.w[_attn(part, "weight")], x), self.w[_attn(part, "bias")])

    def sincos(self, n_pos: int) -> Tensor:
        """The keys' 2-D positions: omega [d/4] repeated over the patches, times pos_w and pos_h,
        [sin, cos] of each concatenated along the features -> [d, n_pos]."""
        d = self.mini.n_mmproj_embd
        omega = g.new_tensor(GGMLType.F32, (d // 4,), "omega", TensorFlag.INPUT)
        pos_h = g.new_tensor(GGMLType.F32, (1, n_pos), "pos_h", TensorFlag.INPUT)
        pos_w = g.new_tensor(GGMLType.F32, (1, n_pos), "pos_w", TensorFlag.INPUT)
        omega_b = Tensor(omega.type, (d // 4, n_pos, 1, 1), op=Op.REPEAT, src=[omega])
        halves = []
        for pos in (pos_w, pos_h):
            theta = g.mul(omega_b, pos)
            sin = Tensor(theta.type, theta.ne, op=Op.SIN, src=[theta])
            cos = Tensor(theta.type, theta.ne, op=Op.COS, src=[theta])
            halves.append(_concat0(sin, cos))
        return _concat0(halves[0], halves[1])

    def resampler(self, x: Tensor) -> Tensor:
        hp, n_pos = self.mini, self.n_pos
        d, dh = hp.n_mmproj_embd, RESAMPLER_D_HEAD
        n_head = d // dh
        v = g.mul_mat(self.w[KV_PROJ], x)
        q = self._norm(self.w[QUERY], "q")
        v = self._norm(v, "kv")
        k = g.add(v, self.sincos(n_pos))
        qkv = []
        for t, part, rows in ((q, "q", hp.query_num), (k, "k", n_pos), (v, "v", n_pos)):
            t = g.reshape(self._proj(t, part), (dh, n_head, rows))
            self.graph.expand(t)     # build_attn's ggml_build_forward_order: Q, K, V
            qkv.append(t)
        out = self._proj(attn_core(qkv[0], qkv[1], qkv[2], None, dh ** -0.5, self.flash_attn), "out")
        return g.mul_mat(self.w[PROJ], self._norm(out, "post"))

    def build(self) -> Graph:
        self.graph.expand(self.resampler(self.vit(self.inp())))
        return self.graph


def _concat0(a: Tensor, b: Tensor) -> Tensor:
    """ggml_concat along dim 0."""
    return Tensor(a.type, (a.ne[0] + b.ne[0], *a.ne[1:]), op=Op.CONCAT, src=[a, b], op_params={"dim": 0})
