"""-sm tensor: what each real device behind llama.cpp's Meta() row holds once a model is really loaded.

The Meta() row of a dry run (planner/memory/estimate.py) sizes every tensor whole. A real load
(llama-server, llama-cli) allocates each member's slices in a buffer of its own
(ggml-backend-meta.cpp ggml_backend_meta_alloc_ctx_tensors_from_buft) and reports the meta buffer as
large as its largest member's. Each member holds:
- weights: its slice of every weight as llama_meta_device_get_split_state cuts it (runtime/engine/
  tensor_split.py LlamaTensorSplit: rows, columns or mirrored, whole heads and quant blocks, the
  per-layer rotation), a mirrored or PARTIAL weight whole; each slice padded to the member's alignment
  after its buffer type's alloc size;
- context: its slice of every K and V cache (cache_k_l* / cache_v_l* split along dim 0 in whole KV
  heads) and of the recurrent states (planner/llama/tensor_parallel.state_slices);
- compute: the whole meta compute buffer: ggml_backend_meta_buffer_type_alloc_buffer asks every
  member for a buffer of the full size (the AllReduce's temporary buffers, grown at compute time,
  are outside llama.cpp's breakdown).

Only architectures LlamaTensorSplit covers get members (llama-shaped dense and MoE layers; no
recurrent, MLA or fused-QKV layouts yet): for the others `member_rows` returns ().
"""
from __future__ import annotations

from gguf import GGML_QUANT_SIZES

from planner.core.units import pad
from planner.hardware.inventory import Inventory
from planner.llama.kv import layer_caches
from planner.llama.overhead import device_overhead
from planner.llama.placement import Device
from planner.llama.settings import LlamaSettings
from planner.memory.rows import DeviceMemory
from planner.model.arch import AttnKind
from runtime.engine.hparams import read_hparams
from runtime.engine.tensor_split import LlamaTensorSplit
from runtime.ggml.graph import Tensor
from runtime.ggml.meta import SplitState
from runtime.ggml.profiles import row_padding_bytes

# Architectures whose every static tensor LlamaTensorSplit's rules name as llama.cpp does.
MEMBER_ARCHS = frozenset({"llama", "qwen2", "qwen3", "gemma2", "qwen3moe", "gpt-oss"})


def _slice_bytes(t: Tensor, state: SplitState, j: int, member: Device) -> int:
    """Bytes member j's slice of `t` takes in its buffer: the split dim cut to its count, rows padded
    as the member's buffer type pads them (get_alloc_size), then aligned."""
    ne = list(t.ne)
    if state.axis.is_dim:
        ne[state.axis] = state.totals()[j]
    block, type_size = GGML_QUANT_SIZES[t.type]
    n = 1
    for d in ne[1:]:
        n *= d
    size = ne[0] // block * type_size * n
    if size and member.profile.row_padding:
        size += row_padding_bytes(block, type_size, ne[0], member.profile.row_padding)
    return pad(size, member.alignment)


def member_rows(settings: LlamaSettings, meta_compute: int, inventory: Inventory | None = None
                ) -> tuple[DeviceMemory, ...]:
    """Per real device behind the meta device: weights, context and compute a real load allocates."""
    meta = next((d for d in settings.devices if d.members), None)
    ctx = settings.ctx
    if meta is None or ctx.model.architecture not in MEMBER_ARCHS:
        return ()
    weights = {t.name: Tensor(t.ggml_type, t.shape, name=t.name) for t in ctx.model.tensors}
    split = LlamaTensorSplit(read_hparams(ctx.model, ctx.facts), weights, len(meta.members),
                             settings.flags.tensor_split or None)
    model, context = _weight_slices(settings, meta, weights, split), _context_slices(settings, meta, split)
    return tuple(DeviceMemory(m.name, model[j], context[j], meta_compute, _overhead(m, inventory))
                 for j, m in enumerate(meta.members))


def _overhead(member: Device, inventory: Inventory | None) -> int:
    """The member's own process overhead (each real device holds its context; planner/llama/overhead.py)."""
    o = device_overhead(member, inventory)
    return 0 if o is None else o.bytes


def _weight_slices(settings: LlamaSettings, meta: Device, weights: dict[str, Tensor],
                   split: LlamaTensorSplit) -> list[int]:
    """Each member's weight buffer: the slices of every weight placed on the meta device."""
    out = [0] * len(meta.members)
    for name, row in settings.placement.tensor_buft:
        if row != meta.name:
            continue
        t = weights[settings.ctx.slot_by_name[name].duplicate_of or name]   # a tied output keeps token_embd's name
        state = split(t)
        for j, m in enumerate(meta.members):
            out[j] += _slice_bytes(t, state, j, m)
    return out


def _context_slices(settings: LlamaSettings, meta: Device, split: LlamaTensorSplit) -> list[int]:
    """Each member's K/V slices (cache_k_l* / cache_v_l*, [width, cells, streams] cut along the width)
    and recurrent-state slices of the layers whose caches live on the meta device."""
    out = [0] * len(meta.members)
    for cache in layer_caches(settings):
        if cache.row != meta.name:
            continue
        if cache.member_bytes:   # recurrent states: cut by tensor_parallel.state_slices already
            out = [a + b for a, b in zip(out, cache.member_bytes, strict=True)]
            continue
        lf = settings.ctx.facts.layers[cache.layer]
        if lf.kind not in (AttnKind.FULL, AttnKind.SWA) or not lf.has_kv:
            continue
        for kind, type_, width in (("k", settings.type_k, lf.k_per_cell), ("v", settings.type_v, lf.v_per_cell)):
            t = Tensor(type_, (width, cache.cells, settings.cparams.n_stream), name=f"cache_{kind}_l{cache.layer}")
            state = split(t)
            for j, m in enumerate(meta.members):
                out[j] += _slice_bytes(t, state, j, m)
    return out
