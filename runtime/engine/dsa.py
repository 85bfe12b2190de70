"""DeepSeek sparse attention (deepseek32, glm-dsa): the MLA graph of runtime/engine/deepseek2.py with the lightning
indexer in front of each attention, op for op as the pinned llama.cpp builds it (src/models/deepseek32.cpp,
glm-dsa.cpp; build_attn_inp_k_dsa and build_attn(llm_graph_input_attn_k_dsa) in src/llama-graph.cpp; the two caches
of src/llama-kv-cache-dsa.cpp).

Per layer that owns an indexer (every deepseek32 layer; glm-dsa's indexer.types), from the normed input x and the
query latent qr = norm(wq_a x):
  indexer q = RoPE(attn_q_b qr) [index_head, n_index_head, T]; indexer k = RoPE(LayerNorm(attn_k x)) [index_head, 1, T];
  both times the Hadamard input attn_inp_k_rot; k stored into the indexer cache; weights = proj x, scaled by
  1/sqrt(index_head * n_index_head); score = LIGHTNING_INDEXER(q, cached k, weights, indexer mask) [n_kv, T];
  top_k = cont(TOP_K(score, min(n_kv, index_top_k))).
glm-dsa's other layers reuse the last owner's top_k. The attention is deepseek2's absorbed MLA over a mask that
starts at -inf, has its top-k cells set to 0 (FILL, SET_ROWS of a FILLed zeros tensor) and adds the cache's mask.
llama.cpp uses the fused indexer (cparams.fused_lid, on by default), so its mask is F16 whatever -fa says.
The kernels below compute LIGHTNING_INDEXER, TOP_K and NORM as ggml-cpu defines them (so devices accept the ops);
the runner sizes these graphs and refuses to decode them (it fills no indexer inputs).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from gguf import MODEL_TENSOR as T

from planner.gguf.reader import row_size
from planner.model.tensors import tensor_name
from runtime.engine.builder import AttnInputs, BatchShape, BuiltGraph
from runtime.engine.deepseek2 import MlaBuilder, MlaHParams
from runtime.engine.kvcache import ROT_MIN, KVCache
from runtime.engine.lora import Adapters
from runtime.ggml import build as B
from runtime.ggml import fused_ops as F
from runtime.ggml.graph import GGMLType, Op, Tensor
from runtime.ggml.kernels import KERNELS, read_f32

I32, I64, F16, F32 = GGMLType.I32, GGMLType.I64, GGMLType.F16, GGMLType.F32
LAYER_NORM_EPS = 1e-6   # deepseek32.cpp: hparams.f_norm_eps for the indexer's k_norm (glm-dsa keeps its default)


def index_rotation(index_head: int) -> int:
    """build_input_k_rot of the indexer cache (always rotated): the largest power of two from 64 that divides
    the indexer head."""
    n = ROT_MIN
    while index_head % (2 * n) == 0:
        n *= 2
    return n


def _lightning_indexer_kernel(node: Tensor) -> None:
    """ggml_compute_forward_lightning_indexer: score[s, t, c] = sum_h relu(q[s, t, h] . k[s, c]) w[s, t, h]
    plus the mask."""
    q, k, w, mask = (read_f32(node.source(i)) for i in range(4))
    # numpy order: q (ns, T, H, D), k (ns, C, 1, D), w (ns, 1, T, H), mask (ns|1, 1, T, C)
    dots = np.einsum("sthd,scd->stch", q, k[:, :, 0, :])
    score = np.einsum("stch,sth->stc", np.maximum(dots, 0.0), w[:, 0])
    node.numpy()[...] = (score[:, None] + mask).astype(np.float32)


def _top_k_kernel(node: Tensor) -> None:
    """ggml_compute_forward_top_k: the indices of each row's k largest values (their order is not part of the
    op's contract; the stable descending sort is)."""
    x = read_f32(node.source(0))
    node.numpy()[...] = np.argsort(-x, axis=-1, kind="stable")[..., : node.ne[0]].astype(np.int32)


# the DSA graphs are these ops' only users: their kernels join the table where the graphs are built (a device
# runs the ops that have kernels: runtime/ggml/backend.py Device.ops)
KERNELS.setdefault(Op.LIGHTNING_INDEXER, _lightning_indexer_kernel)
KERNELS.setdefault(Op.TOP_K, _top_k_kernel)


class DsaBuilder(MlaBuilder):
    """MlaBuilder with the lightning indexer: `index_cache[il]` is layer il's indexer key cache (None where the
    layer owns no indexer)."""

    def __init__(self, hp: MlaHParams, weights: Mapping[str, Tensor], kv: KVCache,
                 index_cache: Sequence[Tensor | None], *, flash_attn: bool, offload_kqv: bool,
                 lora: Adapters | None = None) -> None:
        super().__init__(hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv, lora=lora)
        self.index_cache = index_cache
        self.top_k: Tensor | None = None

    def _inputs(self, shape: BatchShape) -> None:
        """build_attn_inp_k_dsa: after the MLA cache's indices and mask, the indexer cache's indices, its
        F16 mask (the fused indexer's) and the Hadamard matrix attn_inp_k_rot."""
        super()._inputs(shape)
        t, ns = shape.n_tokens, self.kv.n_stream
        [(_, n_kv)] = shape.n_kv
        self.index_idxs = B.new_input(I64, (t,), "attn_inp_k_idxs")
        self.index_mask = B.new_input(F16, (n_kv, t // ns, 1, ns), "attn_inp_kq_mask")
        side = index_rotation(self.hp.index_head)
        self.index_rot = B.new_input(F32, (side, side), "attn_inp_k_rot")

    INDEX_ROTATED = True   # the indexer's Q and K times the Hadamard input (attn_inp_k_rot)

    def _indexer(self, x: Tensor, qr: Tensor, il: int, n_tokens: int) -> Tensor:
        """The lightning indexer of layer il: the top-k cells each token attends to, [k, T / ns, 1, ns] I32."""
        hp, g = self.hp, self.out.graph
        hd, nh = hp.index_head, hp.n_index_head
        q = B.mul_mat(self._wl(T.INDEXER_ATTN_Q_B, il), qr, name=f"indexer_q-{il}")
        q = self._index_rope(B.reshape(q, (hd, nh, n_tokens)), il, "indexer_q")
        k = B.mul_mat(self._wl(T.INDEXER_ATTN_K, il), x, name=f"indexer_k-{il}")
        k = self._layer_norm(k, il)
        k = self._index_rope(B.reshape(k, (hd, 1, n_tokens)), il, "indexer_k")
        if self.INDEX_ROTATED:
            q = B.mul_mat(self.index_rot, q, name=f"indexer_q-{il}")
            k = B.mul_mat(self.index_rot, k, name=f"indexer_k-{il}")
        cache = self.index_cache[il]
        assert cache is not None, f"layer {il} owns an indexer but has no indexer cache"
        k2 = B.view(k, (k.ne[0] * k.ne[1], k.ne[2]), (k.nb[0], k.nb[2]), 0, name=f"{k.name} (view)")
        kc = cache if cache.ne[2] == 1 else B.reshape(cache, (cache.ne[0], cache.ne[1] * cache.ne[2]))
        g.expand(B.set_rows(kc, k2, self.index_idxs, name=f"cache_lid_k_l{il} (set_rows)"))
        w = B.mul_mat(self._wl(T.INDEXER_PROJ, il), x, name=f"indexer_weights-{il}")
        [(_, n_kv)] = self.out.shape.n_kv
        ns = cache.ne[2]
        row = row_size(cache.type, hd)
        keys = B.view(cache, (hd, 1, n_kv, ns), (cache.nb[0], row, row, row_size(cache.type, hd * cache.ne[1])), 0,
                      name=f"lid_k-{il}")
        q = B.view(q, (hd, nh, n_tokens // ns, ns), (q.nb[0], q.nb[1], q.nb[2], q.nb[3] // ns), 0)
        w = B.view(w, (nh, n_tokens // ns, 1, ns), (w.nb[0], w.nb[1], w.nb[2] // ns, w.nb[3] // ns), 0)
        w = B.scale(w, 1.0 / math.sqrt(hd * nh), name=f"indexer_weights-{il}")
        score = B._node(Op.LIGHTNING_INDEXER, (n_kv, q.ne[2], 1, q.ne[3]), [q, keys, w, self.index_mask],
                        f"indexer_score-{il}")
        n_top = min(score.ne[0], hp.index_top_k)
        top = B._node(Op.TOP_K, (n_top, *score.ne[1:]), [score], f"top_k-{il}", I32)
        return B.cont(top, name=f"top_k-{il}")

    def _index_rope(self, x: Tensor, il: int, name: str) -> Tensor:
        r = B.rope(x, self.out.pos, self.hp.n_rot, int(self.hp.index_rope), self.hp.freq_base, name=f"{name}-{il}")
        r.op_params["freq_scale"] = self.hp.freq_scale
        return r

    def _layer_norm(self, x: Tensor, il: int) -> Tensor:
        """build_norm(LLM_NORM) with weight and bias: norm (pinned to the layer's device), times, plus."""
        n = F.norm(x, LAYER_NORM_EPS, name=f"norm-{il}")   # ggml_norm, its kernel in fused_ops
        self.out.norm_pins.append((n, il))
        n = B.mul(n, self._wl(T.INDEXER_K_NORM, il), name=f"indexer_k-{il}")
        return B.add(n, self._need(tensor_name(T.INDEXER_K_NORM, il, "bias")), name=f"indexer_k-{il}")

    def _attn_block(self, x: Tensor, il: int, n_tokens: int) -> Tensor:
        hp = self.hp
        qr = B.mul_mat(self._wl(T.ATTN_Q_A, il), x, name=f"qr-{il}")
        qr = self.norm(qr, self._wl(T.ATTN_Q_A_NORM, il), il, f"qr-{il}")
        if hp.index_full[il]:
            self.top_k = self._indexer(x, qr, il, n_tokens)
        if self.top_k is None:
            raise ValueError(f"layer {il} shares an indexer but no earlier layer owns one")
        q = B.mul_mat(self._wl(T.ATTN_Q_B, il), qr, name=f"q-{il}")
        return self.attention(il, *self._qkv(x, il, n_tokens, q))

    def _mask(self, il: int, inp: AttnInputs) -> Tensor:
        """build_attn(llm_graph_input_attn_k_dsa): -inf everywhere but the top-k cells, plus the cache's mask."""
        top = self.top_k
        assert top is not None
        mask = inp.mask
        every = B._node(Op.FILL, mask.ne, [mask], f"kq_mask_fill-{il}", mask.type, c=-math.inf)
        every = B.view(every, (1, every.ne[0], every.ne[1], every.ne[3]),
                       (every.nb[0], every.nb[0], every.nb[1], every.nb[2]), 0)
        # [k, T, 1, ns] -> [k, T, ns, 1]: set_rows' indices for the mask's rows of one cell
        idx = B.view(top, (top.ne[0], top.ne[1], top.ne[3], 1),
                     (top.nb[0], top.nb[1], top.nb[2], top.ne[3] * top.nb[3]), 0)
        zeros = B.new_tensor(F32, (1, idx.ne[0], idx.ne[1], idx.ne[2]))
        zeros = B._node(Op.FILL, zeros.ne, [zeros], f"zeros-{il}", F32, c=0.0)
        kept = B.set_rows(every, zeros, idx, name=f"kq_mask_top_k-{il}")
        kept = B.view(kept, (kept.ne[1], kept.ne[2], 1, kept.ne[3]), (kept.nb[0], kept.nb[2], kept.nb[3], kept.nb[3]),
                      0)
        return B.add(kept, mask, name=f"kq_mask_top_k-{il}")

    def build(self, shape: BatchShape) -> BuiltGraph:
        self.top_k = None
        return super().build(shape)


def mla_builder(hp: MlaHParams, weights: Mapping[str, Tensor], kv: KVCache, index_cache: Sequence[Tensor | None],
                *, flash_attn: bool, offload_kqv: bool) -> MlaBuilder:
    """The MLA graph builder of this model: DsaBuilder where it has a lightning indexer."""
    if hp.dsa:
        return DsaBuilder(hp, weights, kv, index_cache, flash_attn=flash_attn, offload_kqv=offload_kqv)
    return MlaBuilder(hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv)
