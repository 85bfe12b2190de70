"""Manifold-constrained hyper-connections (mHC) as the pinned llama.cpp builds them around each sub-block of
glm5-next and deepseek4 (src/models/glm5-next.cpp and deepseek4.cpp build the same build_hc_pre,
build_hc_sinkhorn and build_hc_post; glm5-next's build_hc_mean is here, deepseek4's build_hc_head in its module).

The residual is hc streams [n_embd, hc, T]. Before a sub-block: mixes = hc_fn . rms_norm(streams flattened)
[(2 + hc) hc, T]; the read gate sigmoid(mixes[:hc] scale[0] + base[:hc]) + eps weights the streams into the
sub-block's input (DSV4_HC_PRE), the write gate is 2 sigmoid(mixes[hc:2 hc] scale[1] + base[hc:2 hc]) and the
stream mixing comb [hc, hc, T] the Sinkhorn normalisation of mixes[2 hc:] scale[2] + base[2 hc:] (DSV4_HC_COMB).
After it: stream dst = out * post[dst] + sum over src of residual[src] * comb[dst, src] (DSV4_HC_POST).
llama.cpp builds the three fused ops unless resolve_fused_ops turned one off (a layer's fused node placed on
another device than the layer: runner._resolve_fused_ops); an op turned off is built from plain ops, as here.
"""
from __future__ import annotations

from collections.abc import Set

from runtime.engine.hy_v4 import _scale_bias
from runtime.ggml import attn_res, ssm
from runtime.ggml import build as B
from runtime.ggml.graph import GGMLType, Op, Tensor

F32 = GGMLType.F32
HC_POST_SCALE = 2.0   # build_hc_pre: the write gate is 2 sigmoid(...)
# llama-context.cpp resolve_fused_ops: the fused hyper-connection ops, probed in this order on a one-token graph
HC_FUSED = (Op.DSV4_HC_PRE, Op.DSV4_HC_COMB, Op.DSV4_HC_POST)


def fill(a: Tensor, c: float, name: str = "") -> Tensor:
    """ggml_fill: a new tensor of a's shape and type, every element c."""
    return B._node(Op.FILL, a.ne, [a], name, a.type, c=c)


def sum_rows(a: Tensor) -> Tensor:
    return B._node(Op.SUM_ROWS, (1, *a.ne[1:]), [a], "", a.type)


def _div(a: Tensor, b: Tensor) -> Tensor:
    return B._node(Op.DIV, a.ne, [a, b], "", a.type)


def hc_mean(x: Tensor) -> Tensor:
    """build_hc_mean: the streams of x [n_embd, hc, T] summed, times 1 / hc."""
    hc = x.ne[1]
    acc = B.view(x, (x.ne[0], x.ne[2]), (x.nb[0], x.nb[2]), 0)
    for s in range(1, hc):
        acc = B.add(acc, B.view(x, (x.ne[0], x.ne[2]), (x.nb[0], x.nb[2]), s * x.nb[1]))
    return B.scale(acc, 1.0 / hc, name="hc_head")


def weighted_streams(x: Tensor, w: Tensor) -> Tensor:
    """build_hc_pre without DSV4_HC_PRE (and deepseek4's build_hc_head, il = -1): the sum over streams of
    x[:, i, :] * w[i, :]."""
    n_embd, nt = x.ne[0], x.ne[2]
    total: Tensor | None = None
    for i in range(x.ne[1]):
        cur = B.mul(B.view(x, (n_embd, nt), (x.nb[0], x.nb[2]), i * x.nb[1]),
                    B.view(w, (1, nt), (w.nb[0], w.nb[1]), i * w.nb[0]))
        total = B.add(total, cur) if total is not None else cur
    assert total is not None
    return total


class HyperConnections:
    """One graph's mHC: the RMS epsilon, the gates' epsilon, the Sinkhorn iterations, the fused ops turned off, and
    the graph's list of fused nodes (BuiltGraph.fused) each fused node is recorded in with its layer."""

    def __init__(self, rms_eps: float, eps: float, iters: int, unfused: Set[Op],
                 fused: list[tuple[Op, Tensor, int]]) -> None:
        self.rms_eps, self.eps, self.iters = rms_eps, eps, iters
        self.unfused, self.fused = unfused, fused

    def _record(self, node: Tensor, il: int) -> Tensor:
        self.fused.append((node.op, node, il))
        return node

    @staticmethod
    def _gate(mixes: Tensor, scale: Tensor, base: Tensor, hc: int, slot: int) -> Tensor:
        """sigmoid(mixes[slot hc:(slot + 1) hc] * scale[slot] + base[slot hc:(slot + 1) hc])."""
        e = mixes.nb[0]
        part = B.view(mixes, (hc, mixes.ne[1]), (e, mixes.nb[1]), slot * hc * e)
        part = B.mul(part, B.view(scale, (1,), None, slot * scale.nb[0]))
        part = B.add(part, B.view(base, (hc,), None, slot * hc * base.nb[0]))
        return B.unary(part, "SIGMOID")

    def pre(self, x: Tensor, fn: Tensor, scale: Tensor, base: Tensor, il: int,
            name: str) -> tuple[Tensor, Tensor, Tensor]:
        """build_hc_pre: the sub-block's input [n_embd, T], the write gate `post` [hc, T] and the mixing `comb`
        [hc, hc, T]."""
        hc, n_embd, nt = x.ne[1], x.ne[0], x.ne[2]
        mixes = B.mul_mat(fn, B.rms_norm(B.reshape(x, (hc * n_embd, nt)), self.rms_eps), name=f"hc_mixes-{il}")
        pre = _scale_bias(self._gate(mixes, scale, base, hc, 0), 1.0, self.eps, f"hc_pre-{il}")
        post = B.scale(self._gate(mixes, scale, base, hc, 1), HC_POST_SCALE, name=f"hc_post-{il}")
        if Op.DSV4_HC_COMB in self.unfused:
            comb = self._sinkhorn(mixes, scale, base, hc)
        else:
            comb = self._record(attn_res.hc_comb(mixes, scale, base, self.eps, self.iters, name=f"hc_comb-{il}"), il)
        if Op.DSV4_HC_PRE in self.unfused:
            return weighted_streams(x, pre), post, comb
        return self._record(attn_res.hc_pre(x, pre, name=name), il), post, comb

    def _sinkhorn(self, mixes: Tensor, scale: Tensor, base: Tensor, hc: int) -> Tensor:
        """The mixing without DSV4_HC_COMB (build_hc_sinkhorn): mixes[2 hc:] * scale[2] + base[2 hc:] as
        [dst, src, T], soft-maxed, plus eps, its columns normalised, then iters - 1 rounds of rows and columns."""
        nt, e = mixes.ne[1], mixes.nb[0]
        comb = B.view(mixes, (hc * hc, nt), (e, mixes.nb[1]), 2 * hc * e)
        comb = B.mul(comb, B.view(scale, (1,), None, 2 * scale.nb[0]))
        comb = B.add(comb, B.view(base, (hc * hc,), None, 2 * hc * base.nb[0]))
        comb = B.soft_max_ext(B.reshape(comb, (hc, hc, nt)), None, 1.0)
        eps = fill(B.new_tensor(F32, (1,)), self.eps)
        comb = B.add(comb, eps)

        def norm_cols(c: Tensor) -> Tensor:
            col = B.add(sum_rows(B.cont(B.permute(c, (1, 0, 2, 3)))), eps)
            return _div(c, B.permute(col, (1, 0, 2, 3)))

        comb = norm_cols(comb)
        for _ in range(1, self.iters):
            comb = norm_cols(_div(comb, B.add(sum_rows(comb), eps)))
        return comb

    def post(self, x: Tensor, residual: Tensor, post: Tensor, comb: Tensor, il: int, name: str) -> Tensor:
        """build_hc_post: the new streams [n_embd, hc, T] from the sub-block's output x [n_embd, T]."""
        if Op.DSV4_HC_POST not in self.unfused:
            return self._record(attn_res.hc_post(x, residual, post, comb, name=name), il)
        n_embd, nt, hc = x.ne[0], x.ne[1], residual.ne[1]
        out: Tensor | None = None
        for dst in range(hc):
            cur = B.mul(x, B.view(post, (1, nt), (post.nb[0], post.nb[1]), dst * post.nb[0]))
            for src in range(hc):
                res = B.view(residual, (n_embd, nt), (residual.nb[0], residual.nb[2]), src * residual.nb[1])
                mix = B.view(comb, (1, nt), (comb.nb[0], comb.nb[2]), dst * comb.nb[0] + src * comb.nb[1])
                cur = B.add(cur, B.mul(res, mix))
            cur = B.reshape(cur, (n_embd, 1, nt))
            out = ssm.concat(out, cur, 1) if out is not None else cur
        assert out is not None
        return out
