"""Gemma 3n's vision projector (PROJECTOR_TYPE_GEMMA3NV: the MobileNetV5 encoder, its multi-scale
fusion adapter and the Gemma 3n embedder), as clip.cpp builds it at the warmup image size.

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd):
- clip.cpp load_hparams (GEMMA3NV): n_merge 1, the warmup image is image_size square (768 px).
- clip.cpp load_tensors (GEMMA3NV): no transformer layers; the stem (conv, optional bias, norm), then
  per stage 0..3 the blocks v.blk.S.B found in order until one is missing: an edge residual
  (conv_exp, bn1, conv_pwl, bn2), else a universal inverted residual (optional dw_start, pw_exp,
  dw_mid, pw_proj with their norms, layer_scale), and an attention block where attn.query.proj exists
  (key/value projections, optional stride-2 depthwise downsampling with norms, the block norm, layer
  scale); the MSFA (pw_exp, pw_proj, their norms, msfa.norm); mm.input_projection, mm.soft_emb_norm.
- models/mobilenetv5.cpp clip_graph_mobilenetv5::build: SAME padding as ggml_pad_ext where a stride-2
  conv needs it, ggml_conv_2d_direct for full and pointwise convs, ggml_conv_2d_dw (im2col + mul_mat)
  for depthwise ones, RMS norms over channels (permute, cont, rms_norm, mul, permute, cont), GELU,
  multi-query attention over the flattened grid, the features at the end of stages 2 and 3 upscaled
  to the larger grid, concatenated, the MSFA FFN, an average pool to 16 x 16, its norm, then the
  embedder: flatten, scale by sqrt(C), RMS norm, the soft embedding norm, the projection, RMS norm.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gguf import MODEL_TENSOR, Keys

from planner.core.errors import BadInput
from planner.gguf.reader import ModelFile
from runtime.engine.clip_hparams import ClipHParams, name, reading_keys, tower_figures
from runtime.ggml import build as g
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor, TensorFlag

T = MODEL_TENSOR
CV = Keys.ClipVision
GEMMA3NV = "gemma3nv"
MSFA_OUTPUT_SIDE = 16          # mobilenetv5.cpp: target_out_res, the 16 x 16 = 256 image tokens
N_STAGES = 4
STEM = ("v.conv_stem.conv.weight", "v.conv_stem.conv.bias", "v.conv_stem.bn.weight")
MSFA = ("v.msfa.ffn.pw_exp.conv.weight", "v.msfa.ffn.pw_exp.bn.weight", "v.msfa.ffn.pw_proj.conv.weight",
        "v.msfa.ffn.pw_proj.bn.weight", "v.msfa.norm.weight")
# clip-impl.h TN_MNV5_*: a block's tensors, by the field clip.cpp loads them into
ER = ("conv_exp.weight", "bn1.weight", "conv_pwl.weight", "bn2.weight")
UIR = ("dw_start.conv.weight", "dw_start.bn.weight", "pw_exp.conv.weight", "pw_exp.bn.weight",
       "dw_mid.conv.weight", "dw_mid.bn.weight", "pw_proj.conv.weight", "pw_proj.bn.weight", "layer_scale.gamma")
ATTN = ("attn.query.proj.weight", "attn.key.proj.weight", "attn.value.proj.weight", "attn.output.proj.weight",
        "attn.key.down_conv.weight", "attn.key.norm.weight", "attn.value.down_conv.weight", "attn.value.norm.weight",
        "norm.weight", "layer_scale.gamma")


@dataclass(frozen=True)
class MobileNetHParams(ClipHParams):
    blocks: tuple[str, ...] = ()       # each block's name prefix "v.blk.S.B.", in load order
    stage_ends: tuple[int, ...] = ()   # load_tensors' mobilenet_stage_ends: a stage's last block index
    loaded: tuple[str, ...] = ()       # every tensor name load_tensors asks for and finds


def _find_blocks(names: set[str]) -> tuple[list[str], list[int], list[str]]:
    """load_tensors' discovery: per stage, blocks in order until one has none of the entry tensors."""
    blocks: list[str] = []
    ends: list[int] = []
    loaded: list[str] = []
    for stage in range(N_STAGES):
        found = 0
        while True:
            prefix = f"v.blk.{stage}.{found}."
            kinds = [k for k in (ER if prefix + ER[0] in names else UIR) if prefix + k in names]
            entry = prefix + ER[0] in names or prefix + UIR[0] in names or prefix + UIR[2] in names
            attn = prefix + ATTN[0] in names
            if not entry and not attn:
                break
            kinds = kinds if entry else []
            kinds += [k for k in ATTN if attn and prefix + k in names and k not in kinds]
            loaded += [prefix + k for k in kinds]
            blocks.append(prefix)
            found += 1
        if found:
            ends.append(len(blocks) - 1)
    return blocks, ends, loaded


def read_mobilenet_hparams(model: ModelFile) -> MobileNetHParams:
    meta, names = model.metadata, {t.name for t in model.tensors}
    proj = model.tensor(name(T.V_MM_INP_PROJ))
    if proj is None or name(T.V_MM_SOFT_EMB_NORM) not in names:
        raise BadInput(f"{model.path}: a gemma3nv projector without {name(T.V_MM_INP_PROJ)} and "
                       f"{name(T.V_MM_SOFT_EMB_NORM)}")
    blocks, ends, loaded = _find_blocks(names)
    loaded += [n for n in (*STEM, *MSFA) if n in names] + [name(T.V_MM_INP_PROJ), name(T.V_MM_SOFT_EMB_NORM)]
    with reading_keys(model):
        image = int(meta[CV.IMAGE_SIZE])
        return MobileNetHParams(GEMMA3NV, **tower_figures(meta), image_size=image, patch_size=int(meta[CV.PATCH_SIZE]),
                                n_merge=int(meta.get(CV.Projector.SCALE_FACTOR, 1)), ffn_op="GELU",
                                n_mmproj_embd=proj.shape[0], warmup_image_size=image,
                                blocks=tuple(blocks), stage_ends=tuple(ends), loaded=tuple(loaded))


# conversion/gemma.py writes the embedder's hard-token table and norm (mm.embedding, mm.hard_emb_norm) and
# the audio conformer (a.*, mm.a.*) into the same file; load_tensors never asks for the first two and
# clip_init skips the audio encoder when the vision projector is GEMMA3NV ("we don't support audio for
# Gemma 3N")
GEMMA3N_UNLOADED = (name(T.V_MM_EMBEDDING), name(T.V_MM_HARD_EMB_NORM))
GEMMA3N_AUDIO_PREFIXES = ("a.", "mm.a.")


def gemma3n_left_in_file(tensor: str) -> bool:
    return tensor in GEMMA3N_UNLOADED or tensor.startswith(GEMMA3N_AUDIO_PREFIXES)


def mobilenet_tensor_names(hp: ClipHParams) -> list[str]:
    return list(hp.loaded) if isinstance(hp, MobileNetHParams) else []


def _conv_out(size: int, k: int, s: int, p: int) -> int:
    """ggml_calc_conv_output_size with dilation 1."""
    return (size + 2 * p - k) // s + 1


class MobileNetV5Graph:
    """clip_graph_mobilenetv5::build for one warmup image."""

    def __init__(self, hp: ClipHParams, w: Mapping[str, Tensor], flash_attn: bool) -> None:
        del flash_attn        # the attention blocks are written out with soft_max: no flash attention
        if not isinstance(hp, MobileNetHParams):
            raise TypeError("MobileNetV5Graph needs read_mobilenet_hparams' figures")
        self.hp, self.w = hp, w
        self.graph = Graph()

    def _opt(self, n: str) -> Tensor | None:
        return self.w.get(n)

    # --- ggml helpers as mobilenetv5.cpp calls them --------------------------------------------------

    def rms_norm_2d(self, x: Tensor, weight: Tensor | None) -> Tensor:
        y = g.rms_norm(g.cont(g.permute(x, (2, 1, 0, 3))), 1e-6)
        y = g.mul(y, weight) if weight is not None else y
        return g.cont(g.permute(y, (2, 1, 0, 3)))

    def pad_same(self, x: Tensor, k: int, s: int) -> Tensor:
        """pad_same_2d: asymmetric SAME padding so the stride-s conv covers ceil(size / s) outputs."""
        iw, ih = x.ne[0], x.ne[1]
        pad_h = max(0, (-(-ih // s) - 1) * s + k - ih)
        pad_w = max(0, (-(-iw // s) - 1) * s + k - iw)
        if pad_h == 0 and pad_w == 0:
            return x
        return Tensor(x.type, (iw + pad_w, ih + pad_h, x.ne[2], x.ne[3]), op=Op.PAD, src=[x])

    def conv(self, kernel: Tensor, x: Tensor, s: int = 1, p: int = 0) -> Tensor:
        """ggml_conv_2d_direct: one CONV_2D node of the input's type, [OW, OH, OC, N]."""
        ne = (_conv_out(x.ne[0], kernel.ne[0], s, p), _conv_out(x.ne[1], kernel.ne[1], s, p), kernel.ne[3], x.ne[3])
        return Tensor(x.type, ne, op=Op.CONV_2D, src=[kernel, x])

    def conv_dw(self, kernel: Tensor, x: Tensor, s: int, p: int) -> Tensor:
        """ggml_conv_2d_dw: im2col (f16) of the channels as a batch, a broadcast mul_mat, reshape."""
        k0, k1 = kernel.ne[0], kernel.ne[1]
        new_a = g.reshape(kernel, (k0, k1, 1, kernel.ne[2] * kernel.ne[3]))
        b = g.reshape(x, (x.ne[0], x.ne[1], 1, x.ne[2] * x.ne[3]))
        ow, oh = _conv_out(x.ne[0], k0, s, p), _conv_out(x.ne[1], k1, s, p)
        col_type = GGMLType.F32 if kernel.type == GGMLType.BF16 else GGMLType.F16
        col = Tensor(col_type, (k0 * k1, ow, oh, b.ne[3]), op=Op.IM2COL, src=[new_a, b])
        new_b = g.reshape(col, (col.ne[0], oh * ow, x.ne[2], x.ne[3]))
        a2 = g.reshape(new_a, (k0 * k1, 1, new_a.ne[3], 1))
        return g.reshape(g.mul_mat(a2, new_b), (ow, oh, x.ne[2], x.ne[3]))

    # --- blocks --------------------------------------------------------------------------------------

    def edge_residual(self, x: Tensor, p: str, stride: int) -> Tensor:
        exp = self.w[p + "conv_exp.weight"]
        # a stride-2 block pads SAME (Conv2dSame), the others pad 1
        y = self.conv(exp, self.pad_same(x, 3, 2), 2, 0) if stride == 2 else self.conv(exp, x, stride, 1)
        if self._opt(p + "bn1.weight") is not None:
            y = self.rms_norm_2d(y, self.w[p + "bn1.weight"])
        y = self.conv(self.w[p + "conv_pwl.weight"], g.unary(y, "GELU"))
        if self._opt(p + "bn2.weight") is not None:
            y = self.rms_norm_2d(y, self.w[p + "bn2.weight"])
        if stride == 1 and x.ne[2] == y.ne[2] and x.ne[0] == y.ne[0]:
            y = g.add(y, x)
        return y

    def inverted_residual(self, x: Tensor, p: str, stride: int) -> Tensor:
        y = x
        start = self._opt(p + "dw_start.conv.weight")
        if start is not None:
            y = self.conv_dw(start, y, 1, start.ne[0] // 2)
            y = self.norm_opt(y, p + "dw_start.bn.weight")
        exp = self._opt(p + "pw_exp.conv.weight")
        if exp is not None:
            y = g.unary(self.norm_opt(self.conv(exp, y), p + "pw_exp.bn.weight"), "GELU")
        mid = self._opt(p + "dw_mid.conv.weight")
        if mid is not None:
            k = mid.ne[0]
            y = self.conv_dw(mid, self.pad_same(y, k, stride), stride, 0) if stride > 1 else \
                self.conv_dw(mid, y, stride, k // 2)
            y = g.unary(self.norm_opt(y, p + "dw_mid.bn.weight"), "GELU")
        proj = self._opt(p + "pw_proj.conv.weight")
        if proj is not None:
            y = self.norm_opt(self.conv(proj, y), p + "pw_proj.bn.weight")
        gamma = self._opt(p + "layer_scale.gamma")
        y = g.mul(y, gamma) if gamma is not None else y
        if x.ne[0] == y.ne[0] and x.ne[1] == y.ne[1] and x.ne[2] == y.ne[2]:
            y = g.add(y, x)
        return y

    def norm_opt(self, x: Tensor, n: str) -> Tensor:
        wt = self._opt(n)
        return self.rms_norm_2d(x, wt) if wt is not None else x

    def downsampled(self, x: Tensor, p: str, which: str) -> Tensor:
        dw = self._opt(f"{p}attn.{which}.down_conv.weight")
        if dw is None:
            return x
        y = self.conv_dw(dw, self.pad_same(x, dw.ne[0], 2), 2, 0)
        return self.norm_opt(y, f"{p}attn.{which}.norm.weight")

    def attention(self, x: Tensor, p: str) -> Tensor:
        """build_mobilenet_attn: multi-query attention (one key/value head) over the W x H grid."""
        cur = self.norm_opt(x, p + "norm.weight")
        q = self.conv(self.w[p + "attn.query.proj.weight"], cur)
        k = self.conv(self.w[p + "attn.key.proj.weight"], self.downsampled(cur, p, "key"))
        v = self.conv(self.w[p + "attn.value.proj.weight"], self.downsampled(cur, p, "value"))
        w, h, d = cur.ne[0], cur.ne[1], k.ne[2]
        n_head, n, m = q.ne[2] // d, w * h, k.ne[0] * k.ne[1]
        q = g.reshape(g.reshape(q, (n, d * n_head, 1)), (n, d, n_head, 1))
        q = g.cont(g.permute(q, (1, 0, 2, 3)))
        k = g.cont(g.permute(g.reshape(g.reshape(k, (m, d, 1)), (m, d, 1, 1)), (1, 0, 2, 3)))
        v = g.cont(g.reshape(g.reshape(v, (m, d, 1)), (m, d, 1, 1)))
        scores = g.soft_max_ext(g.scale(g.mul_mat(k, q), 1.0 / math.sqrt(d)), None, 1.0)
        kqv = g.cont(g.permute(g.mul_mat(v, scores), (1, 0, 2, 3)))
        kqv = g.cont(g.reshape(g.reshape(kqv, (n, d * n_head, 1)), (w, h, d * n_head, 1)))
        y = self.conv(self.w[p + "attn.output.proj.weight"], kqv)
        if x.ne[0] == y.ne[0] and x.ne[2] == y.ne[2]:
            gamma = self._opt(p + "layer_scale.gamma")
            y = g.mul(y, gamma) if gamma is not None else y
            y = g.add(y, x)
        return y

    # --- the graph -----------------------------------------------------------------------------------

    def stem(self) -> Tensor:
        side = self.hp.warmup_image_size
        raw = g.new_tensor(GGMLType.F32, (side, side, 3, 1), "inp_raw", TensorFlag.INPUT)
        x = self.conv(self.w[STEM[0]], self.pad_same(raw, 3, 2), 2, 0)
        bias = self._opt(STEM[1])
        x = g.add(x, bias) if bias is not None else x
        return g.unary(self.norm_opt(x, STEM[2]), "GELU")

    def msfa(self, feats: list[Tensor]) -> Tensor:
        hi_w, hi_h = feats[0].ne[0], feats[0].ne[1]
        resized = []
        for f in feats:
            if f.ne[0] < hi_w or f.ne[1] < hi_h:
                s = hi_w // f.ne[0]
                f = Tensor(f.type, (f.ne[0] * s, f.ne[1] * s, f.ne[2], f.ne[3]), op=Op.UPSCALE, src=[f])
            resized.append(f)
        x = resized[0]
        for f in resized[1:]:
            x = Tensor(x.type, (x.ne[0], x.ne[1], x.ne[2] + f.ne[2], x.ne[3]), op=Op.CONCAT, src=[x, f],
                       op_params={"dim": 2})
        exp = self._opt(MSFA[0])
        if exp is not None:
            x = g.unary(self.norm_opt(self.conv(exp, x), MSFA[1]), "GELU")
        proj = self._opt(MSFA[2])
        if proj is not None:
            x = self.norm_opt(self.conv(proj, x), MSFA[3])
        if x.ne[0] > MSFA_OUTPUT_SIDE:
            s = x.ne[0] // MSFA_OUTPUT_SIDE
            x = Tensor(GGMLType.F32, (x.ne[0] // s, x.ne[1] // s, x.ne[2], x.ne[3]), op=Op.POOL_2D, src=[x],
                       op_params={"k": s, "s": s})
        return self.norm_opt(x, MSFA[4])

    def embed(self, x: Tensor) -> Tensor:
        w, h, c = x.ne[0], x.ne[1], x.ne[2]
        x = g.cont(g.permute(g.permute(x, (2, 1, 0, 3)), (0, 2, 1, 3)))
        x = g.cont(g.reshape(x, (c, w * h, 1)))
        x = g.mul(g.rms_norm(g.scale(x, math.sqrt(c)), 1e-6), self.w[name(T.V_MM_SOFT_EMB_NORM)])
        return g.rms_norm(g.mul_mat(self.w[name(T.V_MM_INP_PROJ)], x), 1e-6)

    def build(self) -> Graph:
        hp = self.hp
        x = self.stem()
        starts = {0} | {e + 1 for e in hp.stage_ends}
        fusion = set(hp.stage_ends[2:4]) if len(hp.stage_ends) >= 4 else {len(hp.blocks) - 1}
        feats = []
        for i, p in enumerate(hp.blocks):
            stride = 2 if i in starts else 1
            if p + ER[0] in self.w:
                x = self.edge_residual(x, p, stride)
            elif p + ATTN[0] in self.w:
                x = self.attention(x, p)
            else:
                x = self.inverted_residual(x, p, stride)
            if i in fusion:
                feats.append(x)
        if feats:
            x = self.msfa(feats)
        if x.ne[2] != hp.n_embd:
            raise ValueError(f"the encoder's {x.ne[2]} channels are not the file's n_embd {hp.n_embd}")
        self.graph.expand(self.embed(x))
        return self.graph
