"""gemma3n (Gemma 3n): node for node as src/models/gemma3n.cpp builds it at the pinned build (DESIGN.md).

Gemma 3n shares Gemma 4's attention machinery (runtime/engine/gemma4.py: Q/K norms with weights, V
normed without, shared-KV blocks reading earlier caches, per-layer embeddings' inputs) and adds:
- AltUp: the scaled embeddings become four streams ([n_embd, n_tokens, 4]: the input, then three
  projections of it rescaled to its magnitude, concatenated); each block predicts all streams from a
  router over the active one (RMS norm, 1/n_embd, a matmul, tanh, 4x4 coefficients per token), runs
  attention and the FFN on the active prediction, and corrects every stream by the innovation; after
  the last block the three extra streams are projected back, rescaled and averaged with the first;
- LAuReL: a rank-64 residual branch beside attention, summed with it and scaled by 1/sqrt(2);
- activation sparsity: the first 10 blocks keep only the gate activations above mean + 1.645 std;
- the per-layer embeddings enter through the corrected active stream (times altup_correct_scale, gate,
  GELU, times its slice, projection, norm) added to the three other streams;
- the output rows are picked after the merge; the final logits are soft-capped.
The loader fixes four streams, rank 64, a PLE width of 256 and 20 cache-owning blocks (llama-hparams.h
defaults, load_arch_hparams).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from gguf import MODEL_TENSOR as T

from planner.gguf.reader import ModelFile
from planner.model.arch import ModelFacts
from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, tensor_name
from runtime.engine.builder import BatchShape, BuiltGraph
from runtime.engine.gemma4 import Gemma4Builder, Gemma4HParams, read_gemma4_hparams
from runtime.engine.recurrent import token_embeddings
from runtime.ggml import build as B
from runtime.ggml.deltanet import repeat_4d
from runtime.ggml.graph import GGMLType, Op, Tensor
from runtime.ggml.kernels import KERNELS, read_f32
from runtime.ggml.ssm import concat

GEMMA3N = "gemma3n"
F32 = GGMLType.F32
N_ALTUP = 4                  # llama_hparams::n_altup
I_ALTUP_ACT = 0              # llama_hparams::i_altup_act
N_EMBD_ALTUP = 256           # llama_hparams::n_embd_altup (the per-layer embeddings' width)
N_LAYER_SPARSITY = 10        # gemma3n.cpp graph::n_layer_sparsity
SPARSITY_STD_MUL = 1.6448533535003662   # graph::f_sparsity_std_mul, normal_dist.icdf(0.95)


# --- ops gemma3n alone uses here (ggml.c shapes; numpy kernels as ggml-cpu computes them) --------------------
def _unary_node(op: Op, a: Tensor, ne: tuple[int, ...] | None = None, name: str = "") -> Tensor:
    return Tensor(a.type, ne or a.ne, name=name, op=op, src=[a])


def sqrt(a: Tensor) -> Tensor:
    return _unary_node(Op.SQRT, a)


def mean(a: Tensor) -> Tensor:
    """ggml_mean: each row's mean, [1, ne1, ne2, ne3]."""
    return _unary_node(Op.MEAN, a, (1, *a.ne[1:]))


def sub(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    return Tensor(a.type, a.ne, name=name, op=Op.SUB, src=[a, b])


def div(a: Tensor, b: Tensor) -> Tensor:
    return Tensor(a.type, a.ne, op=Op.DIV, src=[a, b])


def _rows(node: Tensor, f) -> None:
    target = node.numpy()
    target[...] = f(read_f32(node.source(0))).reshape(target.shape)


def _binary(node: Tensor, f) -> None:
    a, b = read_f32(node.source(0)), read_f32(node.source(1))
    target = node.numpy()
    target[...] = f(a, np.broadcast_to(b, a.shape) if b.shape != a.shape else b).reshape(target.shape)


# gemma3n's graphs are these ops' only users here, so their kernels join the table where they are built
# (a device runs the ops that have kernels: runtime/ggml/backend.py Device.ops).
KERNELS.setdefault(Op.SQRT, lambda n: _rows(n, np.sqrt))
KERNELS.setdefault(Op.MEAN, lambda n: _rows(n, lambda x: x.mean(axis=-1, keepdims=True)))
KERNELS.setdefault(Op.SUB, lambda n: _binary(n, np.subtract))


def read_gemma3n_hparams(model: ModelFile, facts: ModelFacts) -> Gemma4HParams:
    """gemma4's reading (the same keys and cache reuse) with the PLE width the gemma3n loader fixes."""
    return replace(read_gemma4_hparams(model, facts), n_embd_per_layer=N_EMBD_ALTUP)


class Gemma3nBuilder(Gemma4Builder):
    def _slice(self, x: Tensor, i: int, name: str = "") -> Tensor:
        """gemma3n_view_2d_slice: x[:, :, i] of a [ne0, ne1, ne2] tensor."""
        return B.view(x, (x.ne[0], x.ne[1]), (x.nb[0], x.nb[1]), i * x.nb[2], name=name)

    def _rest(self, x: Tensor) -> Tensor:
        """The streams past the first: a [ne0, ne1, N_ALTUP - 1] view."""
        return B.view(x, (x.ne[0], x.ne[1], N_ALTUP - 1), (x.nb[0], x.nb[1], x.nb[2]), x.nb[2])

    @staticmethod
    def _magnitude(x: Tensor) -> Tensor:
        """calc_magnitude: sqrt(sum_rows(x^2))."""
        return sqrt(B._node(Op.SUM_ROWS, (1, *x.ne[1:]), [B.sqr(x)], ""))

    def _router(self, x: Tensor, il: int) -> Tensor:
        """altup_compute_router_modalities: [N_ALTUP, n_tokens]."""
        r = self.norm(x, tensor_name(T.ALTUP_ROUTER_NORM, il), il)
        r = B.scale(r, 1.0 / self.hp.n_embd)
        return B.unary(B.mul_mat(self._need(tensor_name(T.ALTUP_ROUTER, il)), r), "TANH", name=f"modalities-{il}")

    def _predict(self, cur: Tensor, il: int) -> Tensor:
        """altup_predict: every stream predicted from the active one's router coefficients."""
        n_tokens = cur.ne[1]
        modalities = self._router(self._slice(cur, I_ALTUP_ACT), il)
        coefs = self.lora.mm(self._need(tensor_name(T.ALTUP_PREDICT_COEF, il)), modalities, name=f"all_coefs-{il}")
        coefs = B.reshape(coefs, (N_ALTUP, N_ALTUP, n_tokens))
        permuted = B.cont(B.permute(cur, (1, 2, 0, 3)))
        pred = B.mul_mat(permuted, coefs)
        pred = B.cont(B.permute(pred, (0, 2, 1, 3)))
        return B.add(pred, cur, name=f"predictions-{il}")

    def _correct(self, predictions: Tensor, activated: Tensor, il: int) -> Tensor:
        """altup_correct: each stream plus the innovation times its (coefficient + 1)."""
        n_embd, n_tokens = activated.ne[0], activated.ne[1]
        modalities = self._router(activated, il)
        innovation = sub(activated, self._slice(predictions, I_ALTUP_ACT), name=f"innovation-{il}")
        coefs = self.lora.mm(self._need(tensor_name(T.ALTUP_CORRECT_COEF, il)), modalities)
        coefs = B.scale(coefs, 1.0)          # ggml_scale_bias(1, 1): a SCALE node
        coefs.op_params["bias"] = 1.0
        coefs = B.cont(B.transpose(coefs), (1, n_tokens, N_ALTUP))
        innovation = repeat_4d(innovation, (n_embd, n_tokens, N_ALTUP, 1))
        return B.add(B.mul(innovation, coefs), predictions, name=f"corrected-{il}")

    def _laurel(self, cur: Tensor, il: int) -> Tensor:
        tmp = self.lora.mm(self._need(tensor_name(T.LAUREL_L, il)), cur)
        tmp = self.lora.mm(self._need(tensor_name(T.LAUREL_R, il)), tmp)
        tmp = self.norm(tmp, tensor_name(T.LAUREL_POST_NORM, il), il)
        return B.add(tmp, cur, name=f"laurel_out-{il}")

    @staticmethod
    def _gaussian_topk(x: Tensor) -> Tensor:
        m = mean(x)
        std = sqrt(B.scale(B._node(Op.SUM_ROWS, (1, *x.ne[1:]), [B.sqr(sub(x, m))], ""), 1.0 / (x.ne[0] - 1)))
        cutoff = B.add(m, B.scale(std, SPARSITY_STD_MUL))
        return B.unary(sub(x, cutoff), "RELU")

    def _ffn3n(self, x: Tensor, il: int) -> Tensor:
        up = self.lora.mm(self._need(tensor_name(T.FFN_UP, il)), x, name=f"ffn_up-{il}")
        gate = self.lora.mm(self._need(tensor_name(T.FFN_GATE, il)), x, name=f"ffn_gate-{il}")
        if il < N_LAYER_SPARSITY:
            gate = self._gaussian_topk(gate)
        act = B.mul(up, B.unary(gate, "GELU"))
        return self.lora.mm(self._need(tensor_name(T.FFN_DOWN, il)), act, name=f"ffn_out-{il}")

    def _gemma3n_layer(self, il: int, inp: Tensor, n_tokens: int, ple: Tensor) -> Tensor:
        predictions = self._predict(inp, il)
        active = self._slice(predictions, I_ALTUP_ACT, name=f"active_prediction-{il}")
        cur = self.norm(active, tensor_name(T.ATTN_NORM, il), il)
        laurel = self._laurel(cur, il)
        qkv = self._qkv(cur, il, n_tokens)
        cur = self.attention(il, qkv.q, qkv.k, qkv.v)
        cur = self.lora.mm(self._need(tensor_name(T.ATTN_OUT, il)), cur, name=f"attn_out-{il}")
        cur = self.norm(cur, tensor_name(T.ATTN_POST_NORM, il), il)
        cur = B.add(cur, active, name=f"attn_gated-{il}")
        attn_laurel = B.scale(B.add(cur, laurel), 1.0 / math.sqrt(2.0), name=f"attn_laurel-{il}")
        cur = self._ffn3n(self.norm(attn_laurel, tensor_name(T.FFN_NORM, il), il), il)
        cur = self.norm(cur, tensor_name(T.FFN_POST_NORM, il), -1)
        gated = B.add(cur, attn_laurel, name=f"attn_ffw_laurel_gated-{il}")
        corrected = self._correct(predictions, gated, il)
        first = B.mul(self._slice(corrected, I_ALTUP_ACT), self._need(tensor_name(T.ALTUP_CORRECT_SCALE, il)))
        first = B.unary(self.lora.mm(self._need(tensor_name(T.PER_LAYER_INP_GATE, il)), first), "GELU")
        first = B.mul(first, self._slice(ple, il))
        first = self.lora.mm(self._need(tensor_name(T.PER_LAYER_PROJ, il)), first)
        first = self.norm(first, tensor_name(T.PER_LAYER_POST_NORM, il), il)
        rest = B.add(self._rest(corrected), first)
        return concat(self._slice(corrected, 0), rest, 2, name=f"l_out-{il}")

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g, n_tokens = self.out.graph, shape.n_tokens
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "inp_embd_rows", self.lora)
        x = B.scale(x, math.sqrt(hp.n_embd), name="inp_scaled")
        ple = self._per_layer_inputs(x, n_tokens)
        # the input's three extra AltUp streams, rescaled to its magnitude, stacked behind it
        target = self._magnitude(x)
        added = B.mul_mat(self._need(tensor_name(T.ALTUP_PROJ)), repeat_4d(x, (hp.n_embd, n_tokens, N_ALTUP - 1, 1)))
        added = div(B.mul(added, target), self._magnitude(added))
        cur = concat(x, added, 2, name="inp_stacked")
        for il in range(hp.n_layer):
            cur = self._gemma3n_layer(il, cur, n_tokens, ple)
        # the streams merged back: the extra ones projected, rescaled, averaged with the first
        target = self._magnitude(self._slice(cur, I_ALTUP_ACT))
        unembd = B.mul_mat(self._need(tensor_name(T.ALTUP_UNEMBD_PROJ)), self._rest(cur))
        unembd = div(B.mul(unembd, target), self._magnitude(unembd))
        merged = self._slice(cur, 0)
        for i in range(N_ALTUP - 1):
            merged = B.add(merged, self._slice(unembd, i))
        merged = B.scale(merged, 1.0 / N_ALTUP, name="unembd_merged")
        out = self.norm(B.get_rows(merged, self.out.out_ids), OUTPUT_NORM, -1)
        out_w = self._w(OUTPUT) or self._need(TOKEN_EMBD)
        out = self.lora.mm(out_w, out, name="result_output")
        out = B.scale(B.unary(B.scale(out, 1.0 / hp.softcap), "TANH"), hp.softcap)
        g.expand(out)
        self.out.logits = out
        return self.out
