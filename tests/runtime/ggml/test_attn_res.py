"""The hyper-connection ops' constructors (runtime/ggml/attn_res.py) against ggml.c's shape rules, and the
Vulkan supports_op rule for the lightning indexer (runtime/ggml/vulkan_ops.py)."""
from __future__ import annotations

import pytest

from runtime.ggml import attn_res
from runtime.ggml import build as B
from runtime.ggml.graph import GGMLType, Op, Tensor
from runtime.ggml.kernels import KERNELS
from runtime.ggml.vulkan_ops import vulkan_supports

F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32
N_EMBD, HC, T = 64, 4, 5


def _t(ne: tuple[int, ...], ggml_type: GGMLType = F32) -> Tensor:
    return Tensor(ggml_type, (*ne, *(1,) * (4 - len(ne))))


def test_hc_comb_is_a_4_by_4_mixer_per_token() -> None:
    mix = (2 + HC) * HC   # ggml_dsv4_hc_comb finds hc from (2 + hc) hc = mixes' rows
    comb = attn_res.hc_comb(_t((mix, T)), _t((3,)), _t((mix,)), 1e-6, 20)
    assert (comb.op, comb.ne, comb.type) == (Op.DSV4_HC_COMB, (HC, HC, T, 1), F32)
    assert comb.op_params == {"eps": 1e-6, "n_iter": 20}


@pytest.mark.parametrize("mixes, scale, base", [((20, T), (3,), (20,)),    # hc = 3: (2 + 3) 3 = 15, not 20
                                                ((24, T), (2,), (24,)),    # the scale needs three entries
                                                ((24, T), (3,), (20,))])   # base as wide as the mixes
def test_hc_comb_refuses_what_ggml_asserts(mixes: tuple[int, ...], scale: tuple[int, ...],
                                           base: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="dsv4_hc_comb"):
        attn_res.hc_comb(_t(mixes), _t(scale), _t(base), 1e-6, 20)


def test_hc_post_writes_every_stream() -> None:
    post = _t((HC, T))
    out = attn_res.hc_post(_t((N_EMBD, T)), _t((N_EMBD, HC, T)), post, _t((HC, HC, T)))
    assert (out.op, out.ne, out.src[2]) == (Op.DSV4_HC_POST, (N_EMBD, HC, T, 1), post)
    with pytest.raises(ValueError, match="dsv4_hc_post"):
        attn_res.hc_post(_t((N_EMBD, T)), _t((N_EMBD, HC, T)), _t((HC, T)), _t((HC, HC, T), F16))


def test_rope_back_keeps_the_shape_and_takes_positions() -> None:
    x, pos = _t((128, 8, T)), _t((T,), I32)
    back = attn_res.rope_back(x, pos, 64, 2, 10000.0)
    assert (back.op, back.ne, back.src[1]) == (Op.ROPE_BACK, x.ne, pos)
    with pytest.raises(ValueError, match="rope_back"):
        attn_res.rope_back(x, _t((T + 1,), I32), 64, 2, 10000.0)


def test_the_runtime_sizes_but_does_not_run_them() -> None:
    node = attn_res.hc_post(_t((N_EMBD, T)), _t((N_EMBD, HC, T)), _t((HC, T)), _t((HC, HC, T)))
    with pytest.raises(NotImplementedError, match="DSV4_HC_POST"):
        KERNELS[Op.DSV4_HC_POST](node)


@pytest.mark.parametrize("head, k_type, ok", [(128, F16, True), (128, GGMLType.Q8_0, True), (64, F16, False),
                                              (128, GGMLType.Q4_K, False)])
def test_vulkan_runs_the_lightning_indexer_for_128_wide_heads_only(head: int, k_type: GGMLType, ok: bool) -> None:
    """ggml-vulkan's indexer shader is built for heads of 128 and for the key types of lightning_indexer_k_types."""
    q, k, w, mask = _t((head, 2, T)), _t((head, 1, 256), k_type), _t((2, T)), _t((256, T), F16)
    score = B._node(Op.LIGHTNING_INDEXER, (256, T, 1, 1), [q, k, w, mask], "score")
    assert vulkan_supports(0)(score) is ok


def test_hc_post_takes_no_comb_as_ggml_does() -> None:
    """ggml_dsv4_hc_post checks comb only when one is given."""
    out = attn_res.hc_post(_t((N_EMBD, T)), _t((N_EMBD, HC, T)), _t((HC, T)), None)
    assert (out.ne, out.src[3]) == ((N_EMBD, HC, T, 1), None)


def test_vulkan_refuses_an_indexer_whose_elements_are_not_packed() -> None:
    """supports_op walks q, k, weights, mask and the scores: nb[0] one element, every stride a whole number of
    them. A q view stepping two elements at a time is refused."""
    q = Tensor(F32, (128, 2, T, 1), nb=(8, 2048, 4096, 4096 * T))
    k, w, mask = _t((128, 1, 256), F16), _t((2, T)), _t((256, T), F16)
    score = B._node(Op.LIGHTNING_INDEXER, (256, T, 1, 1), [q, k, w, mask], "score")
    assert vulkan_supports(0)(score) is False


@pytest.mark.parametrize("subgroup, ok", [(0, True), (8, False), (16, True), (32, True)])
def test_vulkan_makes_the_hc_comb_pipeline_for_16_lane_subgroups(subgroup: int, ok: bool) -> None:
    """ggml-vulkan builds no DSV4_HC_COMB pipeline for subgroups under 16 lanes (lavapipe's 8); 0: not measured."""
    mix = (2 + HC) * HC
    comb = attn_res.hc_comb(_t((mix, T)), _t((3,)), _t((mix,)), 1e-6, 20)
    assert vulkan_supports(0, subgroup)(comb) is ok
