"""Predicted speed of a tensor split (`-sm tensor`): N devices that each hold a slice of every layer.

Decode (one token) on the meta device: every member reads its share of each layer's weights and KV
at once, so a layer takes the slowest member's time, not the sum:

    t_token = max_m (s_m · R / BW_m)  +  2 · n_layer · t_reduce  +  t_in  (+ host layers as in throughput.py)
    t_reduce = S · (B / L + lat)      S = log2 P exchange steps, + 2 (fold, copy back) when N != P
    B        = n_embd · 4 · n_tokens  (the f32 residual each reduce sums)

where s_m is member m's share (-ts, else even: llama_meta_device_get_split_state), R the bytes a
token reads in the layers on the meta device (the output matrix included: it is split by rows and
its logits gathered, not reduced), P the largest power of two <= N, L the slowest member's link and
lat its hand-off latency. Two reduces per layer: the attention output and the FFN down projection
produce partial sums (seed 000 "src0 AXIS_0 x AXIS_0 src1 -> PARTIAL"; the generic butterfly of
ggml-backend-meta.cpp, measured in the runtime: tests/runtime/engine/test_meta_runner.py). t_in is the
input row copied to every member (mirrored). On CUDA the pinned build reduces through NCCL when it
is available; this model assumes the generic butterfly (the bytes are the same, NCCL overlaps steps).

Prefill scales the same way: each member computes its share of the split matmuls at its own FLOPs,
and each reduce moves the ubatch's rows.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from planner.llama.placement import CPU
from planner.model.arch import ModelFacts
from planner.model.costs import CostTable
from planner.speed.throughput import (
    ACTIVATION_BYTES_PER_VALUE,
    NO_ATTENTION,
    PlacementView,
    Prediction,
    Rates,
    StageTime,
    decode_cells,
    expert_fraction,
    layer_attention,
    layer_kv_bytes,
    layer_weight_bytes,
    output_bytes,
    prefill_work,
)

# ggml-backend-meta.cpp: a llama-shaped layer ends two subgraphs at PARTIAL nodes (the attention
# output and the FFN down projection, or the experts' sum after the delayed view-and-add tree)
REDUCES_PER_LAYER = 2


def reduce_steps(n_members: int) -> int:
    """Sequential steps of one generic AllReduce: log2 P exchanges, plus the fold and the copy back
    when N is not a power of two (ggml-backend-meta.cpp's butterfly)."""
    p = 1 << (n_members.bit_length() - 1)
    return int(math.log2(p)) + (2 if p != n_members else 0)


def _shares(members: Sequence[str], tensor_split: Sequence[float]) -> dict[str, float]:
    weights = list(tensor_split[:len(members)]) if tensor_split and any(tensor_split) else [1.0] * len(members)
    weights += [0.0] * (len(members) - len(weights))
    total = sum(weights) or 1.0
    return {m: w / total for m, w in zip(members, weights, strict=True)}


def _reduce_seconds(rates: Rates, members: Sequence[str], row_bytes: float) -> float:
    link = min(rates.link(m) for m in members)
    latency = max(rates.latency(m) for m in members)
    return reduce_steps(len(members)) * (row_bytes / link + latency)


def predict_tensor(facts: ModelFacts, costs: CostTable, view: PlacementView, members: Sequence[str],
                   rates: Rates, meta_name: str, tensor_split: Sequence[float] = ()) -> Prediction:
    """The prediction for a placement whose offloaded layers (`view.layer_device == meta_name`) sit
    on a meta device over `members`; host layers cost what they cost in a layer split."""
    shares = _shares(members, tensor_split)
    frac = expert_fraction(facts.n_expert, facts.n_expert_used)
    meta_bytes, host_bytes, meta_layers = 0, 0, 0
    meta_kv, host_kv = 0, 0      # of which the KV cache attention reads (at its own rate)
    meta_att, host_att = NO_ATTENTION, NO_ATTENTION   # the pairs and values of that attention
    for layer in costs.layers:
        if layer.nextn:
            continue
        dense, experts = layer_weight_bytes(layer, frac, view.n_seq)
        kv = layer_kv_bytes(layer, decode_cells(view, layer.window))
        att = layer_attention(facts, layer, view)
        if view.layer_device[layer.index] == meta_name:
            meta_bytes += dense + experts + kv
            meta_kv += kv
            meta_att += att
            meta_layers += 1
        else:
            host_bytes += dense + experts + kv
            host_kv += kv
            host_att += att
    out = output_bytes(costs)
    if view.output_device == meta_name and not view.output_on_host:
        meta_bytes += out
    else:
        host_bytes += out
    row = facts.n_embd * ACTIVATION_BYTES_PER_VALUE
    member_s = {m: shares[m] * ((meta_bytes - meta_kv) / rates.bandwidth(m)
                                + rates.attention_seconds(m, meta_kv, meta_att)) for m in members}
    reduce_s = REDUCES_PER_LAYER * meta_layers * _reduce_seconds(rates, members, row)
    inputs_s = (len(members) * row / min(rates.link(m) for m in members)
                + max(rates.latency(m) for m in members)) if meta_layers else 0.0
    host_s = ((host_bytes - host_kv) / rates.bandwidth(CPU) + rates.attention_seconds(CPU, host_kv, host_att)
              if host_bytes else 0.0)
    t_token = max(member_s.values(), default=0.0) + reduce_s + inputs_s + host_s
    stages = tuple(StageTime(m, int(shares[m] * meta_bytes), member_s[m], int(shares[m] * meta_kv)) for m in members)
    if host_bytes:
        stages += (StageTime(CPU, host_bytes, host_s, host_kv),)
    prefill = _prefill(facts, costs, view, members, shares, rates, meta_name, meta_layers)
    return Prediction(decode_tokens_s=1.0 / t_token if t_token > 0 else 0.0, prefill_tokens_s=prefill,
                      stages=stages, n_boundaries=REDUCES_PER_LAYER * meta_layers, assumed_rates=rates.assumed,
                      rate_sources=rates.source_list)


def _prefill(facts: ModelFacts, costs: CostTable, view: PlacementView, members: Sequence[str],
             shares: dict[str, float], rates: Rates, meta_name: str, meta_layers: int) -> float:
    # the meta device offloads no op (its offload_op is NULL): host layers prefill on the CPU
    work = prefill_work(facts, costs, view, None)
    meta_flops, meta_att = work.flops.get(meta_name, 0.0), work.attention.get(meta_name, 0.0)
    meta_stream = work.streamed.get(meta_name, 0.0)
    t = max((shares[m] * (meta_flops / rates.flops(m) + meta_att / rates.attention_flops(m)
                          + meta_stream / rates.bandwidth(m)) for m in members), default=0.0)
    t += sum(n / rates.flops(CPU) for dev, n in work.flops.items() if dev != meta_name)
    t += sum(n / rates.attention_flops(CPU) for dev, n in work.attention.items() if dev != meta_name)
    t += sum(n / rates.bandwidth(CPU) for dev, n in work.streamed.items() if dev != meta_name)
    t += REDUCES_PER_LAYER * meta_layers * _reduce_seconds(rates, members, work.boundary_bytes)
    return view.n_ubatch / t if t > 0 else 0.0
