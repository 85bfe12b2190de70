"""How llama.cpp spreads a llama-shaped model's static tensors over a meta device (-sm tensor).

Derived from src/llama-model.cpp llama_meta_device_get_split_state at the pinned build (dense
attention and FFN layers; recurrent, MLA and DeepSeek-4 layouts are not covered):

- column-parallel weights split by output rows (AXIS_1): attn_q/k/v, ffn_up/gate (and _exps);
  their biases, the KV caches and the attention sinks split along dim 0;
- row-parallel weights split by input columns (AXIS_0): attn_output, ffn_down (and _exps);
- output.weight by rows (the logits come out split over the vocabulary); ffn_down_exps.bias is
  PARTIAL (each member adds its share of the expert bias before the reduce);
- everything else mirrored (embeddings, norms, per-head Q/K norms, the output bias of attention).

Slices are cut evenly (or by -ts) at multiples of a granularity that keeps whole heads, whole
KV groups and whole quantization blocks (128 elements where the kernels want it), and a per-layer
rotation decides which member takes the short piece, so rounding a head count that does not
divide does not always short the same member.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES

from planner.llama.tensor_parallel import PERF_BLOCK
from runtime.engine.hparams import HParams
from runtime.ggml.graph import Tensor
from runtime.ggml.meta import MIRRORED, SplitAxis, SplitState, slice_counts, split_along

A0, A1 = SplitAxis.AXIS_0, SplitAxis.AXIS_1



@dataclass(frozen=True)
class _Rule:
    """A name pattern, the axis it splits on, the tensor whose type and layer set the split
    (llama.cpp's tensor_axis_0: attn_output.weight for Q/K/V), and its granularity kind."""

    pattern: re.Pattern[str]
    axis: SplitAxis
    axis_0: tuple[str, ...]
    grain: str


def _r(pattern: str, axis: SplitAxis, axis_0: tuple[str, ...] = (), grain: str = "one") -> _Rule:
    return _Rule(re.compile(pattern), axis, axis_0, grain)


_OUT, _DOWN = ("attn_output.weight",), ("ffn_down.weight", "ffn_down_exps.weight")

# In llama.cpp's order: the first match wins.
RULES: tuple[_Rule, ...] = (
    _r(r"blk\.\d+\.attn_q\.weight", A1, _OUT, "q"),
    _r(r"blk\.\d+\.attn_k\.weight", A1, _OUT, "k"),
    _r(r"blk\.\d+\.attn_v\.weight", A1, _OUT, "v"),
    _r(r"blk\.\d+\.attn_q\.bias", A0, _OUT, "q"),
    _r(r"blk\.\d+\.attn_k\.bias", A0, _OUT, "k"),
    _r(r"blk\.\d+\.attn_v\.bias", A0, _OUT, "v"),
    _r(r"blk\.\d+\.attn_(q|k)_norm\.weight", A1, _OUT, "one"),   # per-head norms of one row: mirrored below
    _r(r"cache_k_l\d+", A0, _OUT, "k"),
    _r(r"cache_v_l\d+", A0, _OUT, "v"),
    _r(r"blk\.\d+\.attn_sinks\.weight", A0, _OUT, "head"),
    _r(r"blk\.\d+\.attn_output\.weight", A0, (), "out"),
    _r(r"blk\.\d+\.attn_output\.bias", SplitAxis.MIRRORED),
    _r(r"blk\.\d+\.ffn_(up|gate)(_exps)?\.weight", A1, _DOWN, "ffn"),
    _r(r"blk\.\d+\.ffn_(up|gate)(_exps)?\.bias", A0, _DOWN, "ffn"),
    _r(r"blk\.\d+\.ffn_down(_exps)?\.weight", A0, _DOWN, "ffn"),
    _r(r"blk\.\d+\.ffn_down\.bias", SplitAxis.MIRRORED),
    _r(r"blk\.\d+\.ffn_down_exps\.bias", SplitAxis.PARTIAL, ("ffn_down_exps.weight",)),
    _r(r"output\.weight", A1),
    _r(r"output\.bias", A0),
)


def _layer(name: str) -> int | None:
    m = re.match(r"blk\.(\d+)\.", name) or re.match(r"cache_\w+?_l(\d+)$", name)
    return int(m.group(1)) if m else None


class LlamaTensorSplit:
    """The static split-state callback for one model over `n_devices` members."""

    def __init__(self, hp: HParams, weights: Mapping[str, Tensor], n_devices: int,
                 tensor_split: Sequence[float] | None = None) -> None:
        self.hp, self.weights, self.n = hp, weights, n_devices
        self.tensor_split = tensor_split

    def __call__(self, t: Tensor) -> SplitState:
        rule = next((r for r in RULES if r.pattern.fullmatch(t.name)), None)
        if rule is None or (rule.grain == "one" and rule.axis is A1 and t.ne[1] == 1):
            return MIRRORED
        il = _layer(t.name)
        if rule.axis is SplitAxis.PARTIAL:
            src = self._axis_0(rule, il, t)
            return SplitState(SplitAxis.PARTIAL, self(src).totals())
        if not rule.axis.is_dim:
            return SplitState(rule.axis)
        ref = self._axis_0(rule, il, t)
        block = GGML_QUANT_SIZES[ref.type][0]
        grain = self._granularity(rule.grain, block, il if il is not None else 0)
        counts = slice_counts(t.ne[rule.axis], self.n, grain, self._rotation(il), self.tensor_split)
        return split_along(rule.axis, counts)

    def _axis_0(self, rule: _Rule, il: int | None, t: Tensor) -> Tensor:
        if not rule.axis_0:
            return t
        for suffix in rule.axis_0:
            ref = self.weights.get(f"blk.{il}.{suffix}")
            if ref is not None:
                return ref
        raise KeyError(f"{t.name}: none of {rule.axis_0} in layer {il}")

    def _rotation(self, il: int | None) -> int:
        """get_il_eff: layers of the same kind before this one (SWA or not), modulo N; the
        model-level tensors rotate by n_layer."""
        if il is None:
            return self.hp.n_layer % self.n
        swa = self.hp.swa
        return sum(1 for i in range(il) if swa[i] == swa[il]) % self.n

    def _granularity(self, grain: str, block: int, il: int) -> int:
        """get_split_granularity for regular attention layers and the FFN."""
        if grain == "ffn":
            return math.lcm(block, PERF_BLOCK)
        if grain == "one":
            return 1
        hp = self.hp
        n_gqa = hp.n_head // hp.n_head_kv[il]
        n_embd_q = n_gqa * hp.head_dim   # the Q width of one KV group
        perf = block
        while perf < PERF_BLOCK and perf * self.n < n_embd_q:   # grow only while no member starves
            perf *= 2
        g_q = math.lcm(n_embd_q, perf)
        g_head = g_q // hp.head_dim
        g_kv = g_q // n_gqa
        by_kind: dict[str, Callable[[], int]] = {
            "q": lambda: g_q, "k": lambda: g_kv, "v": lambda: g_kv,   # K and V heads of one size here
            "head": lambda: g_head, "out": lambda: g_head * hp.head_dim,
        }
        return by_kind[grain]()
