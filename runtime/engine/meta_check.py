"""Whether llama.cpp's meta backend can split a model's graphs under -sm tensor, found by resolving them.

llama-fit-params' dry run never executes a graph, so it never asks the meta backend for the split
state of a compute node: a model can pass it and abort at its first token (Gemma 3 270M at
ggml-backend-meta.cpp:543). llama.cpp resolves every node's state when a split runs
(ggml_backend_meta_graph_compute -> ggml_backend_meta_get_split_state), and its handlers assert on what
they cannot split. This module builds the graphs llama.cpp runs — the one-token graph of token
generation (one token per sequence) and the prompt ubatch — and resolves them with the runtime's
split-state rules (runtime/ggml/meta_resolve.py) over the weight layout of
runtime/engine/tensor_split.py, so the abort is derived, not listed. Measured against llama-bench -sm
tensor over rpc-servers: Gemma 3 with one KV head aborts (K's rows of one head reach the per-row K norm
split along dim 0 when a ubatch holds one token), Gemma 3 with four KV heads, llama, qwen2, qwen3,
gemma2, gpt-oss and qwen3moe run.

Only the layers on the meta device count (a layer left on the CPU never reaches the meta backend).
"""
from __future__ import annotations

import re

from planner.llama.placement import Device
from planner.llama.settings import LlamaSettings
from runtime.engine.builder import BatchShape, DecoderBuilder
from runtime.engine.hparams import HParams
from runtime.engine.runner import ModelRunner
from runtime.engine.tensor_split import LlamaTensorSplit
from runtime.ggml.graph import Tensor
from runtime.ggml.meta import MetaSplitError
from runtime.ggml.meta_resolve import SplitResolver

# The llama-shaped architectures whose static layout LlamaTensorSplit reproduces (DecoderBuilder's graphs).
CHECKED_ARCHS = frozenset({"llama", "qwen2", "qwen3", "gemma2", "gemma3", "qwen3moe", "gpt-oss"})
# What llama.cpp aborts with for each runtime rule that refuses a split (ggml-backend-meta.cpp at the pin).
PER_ROW_ASSERT = "ggml-backend-meta.cpp:543: GGML_ASSERT(src_ss[0].axis != GGML_BACKEND_SPLIT_AXIS_0) failed"
_LLAMA_ABORTS = {"a per-row op cannot take rows split along AXIS_0": PER_ROW_ASSERT}
_LAYER = re.compile(r"-(\d+)\b")


def llama_abort(err: MetaSplitError) -> str:
    """llama.cpp's words for a split the runtime refuses (its assert where the rule is one of a handler's)."""
    return next((quoted for why, quoted in _LLAMA_ABORTS.items() if why in str(err)),
                "ggml-backend-meta.cpp ggml_backend_meta_get_split_state aborts")


def _on_meta(node: Tensor, layer_device: tuple[str, ...], meta: str) -> bool:
    """Whether a node belongs to a layer on the meta device (named "-N" by the builder), or to the
    output layer's part of the graph when that is on the meta device."""
    m = _LAYER.search(node.name)
    il = int(m.group(1)) if m else len(layer_device) - 1
    return layer_device[min(il, len(layer_device) - 1)] == meta


_CACHE_SIZE = 64
_cache: dict[tuple, MetaSplitError | None] = {}


def meta_split_error(settings: LlamaSettings) -> MetaSplitError | None:
    """The first node of the one-token or prompt graph llama.cpp's meta backend cannot split, or None
    (also None without a meta device or for an architecture CHECKED_ARCHS does not name). Cached on
    what the graphs and the layout depend on (a planner asks again for every candidate)."""
    meta = next((d for d in settings.devices if d.members), None)
    if meta is None or settings.ctx.model.architecture not in CHECKED_ARCHS:
        return None
    model = settings.ctx.model
    key = (model.path, model.header_bytes, len(meta.members), settings.flags.tensor_split,
           settings.placement.layer_device, settings.cparams, settings.flags.kv_offload)
    if key not in _cache:
        if len(_cache) >= _CACHE_SIZE:
            _cache.pop(next(iter(_cache)))
        _cache[key] = _resolve(settings, meta)
    return _cache[key]


def _resolve(settings: LlamaSettings, meta: Device) -> MetaSplitError | None:
    runner = ModelRunner.from_settings(settings, reserve=False, weights=False)
    assert runner.kv is not None and isinstance(runner.hp, HParams)
    cp = settings.cparams
    full = tuple((k, runner.kv.tables[k].size) for k in runner.kv.kind_order())
    n_prompt = -(-min(cp.n_ctx, cp.n_ubatch) // cp.n_seq) * cp.n_seq
    split = LlamaTensorSplit(runner.hp, runner.weights, len(meta.members), settings.flags.tensor_split or None)
    layer_device = settings.placement.layer_device
    for shape in (BatchShape(cp.n_seq, cp.n_seq, full), BatchShape(n_prompt, 1, full)):
        graph = DecoderBuilder(runner.hp, runner.weights, runner.kv, flash_attn=cp.flash_attn,
                               offload_kqv=settings.flags.kv_offload).build(shape).graph
        resolver = SplitResolver(len(meta.members), split)
        for node in graph.nodes:
            if not _on_meta(node, layer_device, meta.name):
                continue
            try:
                resolver.state(node)
            except MetaSplitError as err:
                return err
    return None
