"""mimo2 (MiMo-V2): the shared decoder, plus the fused attn_qkv of the files that have one (src/models/mimo2.cpp,
pinned build).

A block with attn_qkv projects once and takes Q, K and V as strided views of each token's row: Q and K
heads of key_length, V heads of value_length, at offsets 0, n_head * key_length and that plus n_head_kv *
key_length. Everything else, split Q/K/V included, is the shared builder's (hparams.ARCHS["mimo2"]). A V that
is such a view reaches a transposed cache (-fa off) through ggml_cont_2d, then ggml_pad to the widest V
(llama-kv-cache.cpp cpy_v).
"""
from __future__ import annotations

from gguf import MODEL_TENSOR as T

from planner.gguf.reader import row_size
from planner.model.tensors import tensor_name
from runtime.engine.builder import AttnInputs, DecoderBuilder, Qkv
from runtime.ggml import build as B
from runtime.ggml.fused_ops import pad
from runtime.ggml.graph import Tensor

MIMO2 = "mimo2"


class Mimo2Builder(DecoderBuilder):
    """DecoderBuilder with build_qkv's fused path for blocks that have attn_qkv."""

    def _qkv(self, x: Tensor, il: int, n_tokens: int) -> Qkv:
        wqkv = self._w(tensor_name(T.ATTN_QKV, il))
        if wqkv is None:
            return super()._qkv(x, il, n_tokens)
        hp = self.hp
        hd, hd_v, nh, nkv = hp.head_dim, hp.hd_v, hp.n_head, hp.n_head_kv[il]
        qkv = self.lora.mm(wqkv, x, name=f"wqkv-{il}")
        el, row = row_size(qkv.type, 1), qkv.nb[1]
        q = B.view(qkv, (hd, nh, n_tokens), (el, el * hd, row), 0, name=f"Qcur-{il}")
        k = B.view(qkv, (hd, nkv, n_tokens), (el, el * hd, row), el * hd * nh, name=f"Kcur-{il}")
        v = B.view(qkv, (hd_v, nkv, n_tokens), (el, el * hd_v, row), el * hd * (nh + nkv), name=f"Vcur-{il}")
        return Qkv(self._rope(q, il), self._rope(k, il), v)

    def _store(self, il: int, k: Tensor, v: Tensor, inp: AttnInputs) -> tuple[Tensor, Tensor]:
        width, n_tokens = v.ne[0] * v.ne[1], v.ne[2]
        if not self.kv.v_trans or v.nb[2] == row_size(v.type, width):
            return super()._store(il, k, v, inp)
        kc, vc = self.kv.k[il], self.kv.v[il]
        k2 = B.view(k, (k.ne[0] * k.ne[1], n_tokens), (k.nb[0], k.nb[2]), 0)
        if kc.ne[2] > 1:
            kc = B.reshape(kc, (kc.ne[0], kc.ne[1] * kc.ne[2]))
        store_k = B.set_rows(kc, k2, inp.k_idxs, name=f"cache_k_l{il} (set_rows)")
        v2 = B.cont(v, (width, n_tokens), name=f"v_cont_2d-{il}")
        if width < vc.ne[0]:
            v2 = pad(v2, (vc.ne[0] - width,))
        v2 = B.reshape(v2, (1, v2.ne[0] * n_tokens))
        v_all = B.reshape(vc, (1, vc.n_elements))
        return store_k, B.set_rows(v_all, v2, inp.v_idxs, name=f"cache_v_l{il} (set_rows)")
