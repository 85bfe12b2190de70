"""llama.cpp's flash-attention probe, replayed: where the scheduler puts each layer's fused attention.

llama-context.cpp resolve_fused_ops (pinned build): with -fa auto, llama.cpp builds a graph of one
token per sequence with flash attention on, splits it (ggml_backend_sched_reserve_size, no
allocation) and turns flash attention off when any FLASH_ATTN_EXT node is assigned to another
device than its layer's (model.dev_layer(il), the CPU for host layers, whatever -nkvo says). The
caches exist before the probe, made for flash attention (V untransposed).

planner.llama.settings.pulled_attention states the outcome as a rule, because settings are resolved
before the runtime runs; `flash_attn_mismatches` is the simulation that rule is checked against.
"""
from __future__ import annotations

from dataclasses import replace

from planner.llama.settings import LlamaSettings
from runtime.engine.builder import BatchShape
from runtime.engine.runner import ModelRunner
from runtime.ggml.graph import Op

N_TOKENS_PER_SEQ = 1   # llm_fused_op_flash_attn_probe.n_tokens_per_seq


def flash_attn_mismatches(settings: LlamaSettings) -> dict[int, str]:
    """Layer -> the device its FLASH_ATTN_EXT node is split onto, for the layers where that is not the
    layer's device (empty: llama.cpp keeps -fa auto on)."""
    probe = replace(settings, cparams=replace(settings.cparams, flash_attn=True))
    runner = ModelRunner(probe, {})
    runner.load_weights(copy_data=False)
    runner.alloc_kv()
    assert runner.kv is not None
    n = probe.cparams.n_seq * N_TOKENS_PER_SEQ
    full = tuple((k, runner.kv.tables[k].size) for k in runner.kv.kind_order())
    built = runner._graph(BatchShape(n, n, full))
    runner.sched.split_graph(built.graph)
    out = {}
    for node in built.graph.nodes:
        if node.op is not Op.FLASH_ATTN_EXT:
            continue
        il = int(node.name.rsplit("-", 1)[1])   # the builders name it __fattn__-{il}
        backend = runner.sched.get_tensor_backend(node)
        device = backend.name if backend is not None else ""
        if device != probe.placement.layer_device[il]:
            out[il] = device
    return out
