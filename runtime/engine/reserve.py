"""Compute buffers from the allocator, for the estimate: llama.cpp's sched_reserve replayed.

`reserve_compute` builds the worst-case prompt graph (min(n_ctx, n_ubatch) tokens over the whole
cache) and the one-token graph for resolved settings (planner/llama/settings.py), reserves both
as llama.cpp does (prompt, token, prompt again) and returns each device's compute buffer. No
tensor data is read or written: the weights and caches get addresses in buffers that are never
touched. Results are cached per (model, placement shape), because a planner estimates the same
placement many times.
"""
from __future__ import annotations

import gc
import logging
import os
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from planner.core.errors import FitplanError
from planner.llama.companions import target_n_rs_seq
from planner.llama.placement import row_of
from planner.llama.settings import LlamaSettings
from runtime.engine.deepseek2 import MLA_ARCHS, unsupported_reason
from runtime.engine.deepseek4_hparams import DEEPSEEK4
from runtime.engine.glm5next import GLM5_NEXT
from runtime.engine.glm5next import unsupported_reason as glm5next_unsupported_reason
from runtime.engine.hparams import ARCHS
from runtime.engine.kimi import KDA_ARCHS
from runtime.engine.kimi import unsupported_reason as kda_unsupported_reason
from runtime.engine.lora import applied_loras
from runtime.engine.mtp_graph import MTP_GRAPHS, MtpRunner
from runtime.engine.runner import ModelRunner
from runtime.ggml.profiles import op_offload_min_batch

log = logging.getLogger(__name__)

CACHE_SIZE = 256
ANALYTIC_ENV = "FITPLAN_COMPUTE_MODEL"   # =analytic: skip the runtime (calibrating planner/memory/analytic.py)
_cache: OrderedDict[tuple, _Reserved] = OrderedDict()


def _key(settings: LlamaSettings, n_outputs_max: int | None) -> tuple:
    """Everything of the settings the reserve graphs and their placement depend on, the context's
    output rows, and the applied LoRA adapters (their matmuls join the graphs)."""
    model, placement = settings.ctx.model, settings.placement
    devices = tuple((d.name, d.backend, d.alignment, d.compute_capability, d.members) for d in settings.devices)
    return (model.path, model.header_bytes, devices, placement.layer_device, placement.tensor_buft,
            placement.pipeline_parallel, settings.cparams, settings.flags.flash_attn, settings.flags.kv_offload,
            settings.flags.op_offload, op_offload_min_batch(), tuple(settings.kv_cells.items()), settings.type_k,
            settings.type_v, n_outputs_max or settings.cparams.n_batch, applied_loras(settings.flags),
            target_n_rs_seq(model.architecture, settings.flags))


def supported(settings: LlamaSettings) -> bool:
    """A graph builder exists (any -np, unified or not, and any -ctk/-ctv type: the reserve sizes them).
    Every device class is simulated: offloading devices (CUDA, Vulkan, ...) take host-weight ops
    by their profile's offload_op (runtime/ggml/profiles.py), so a weight staged into a device's
    compute buffer is counted where the scheduler puts it."""
    ctx = settings.ctx
    if ctx.model.architecture in MLA_ARCHS:
        return unsupported_reason(ctx.model, ctx.facts) is None
    if ctx.model.architecture in KDA_ARCHS:
        return kda_unsupported_reason(ctx.model, ctx.facts) is None
    if ctx.model.architecture == GLM5_NEXT:   # glm5n
        return glm5next_unsupported_reason(ctx.model, ctx.facts) is None
    return ctx.model.architecture in ARCHS or ctx.model.architecture == DEEPSEEK4


def reserve_compute(settings: LlamaSettings, n_outputs_max: int | None = None,
                    dry_run: bool = True) -> dict[str, int] | None:
    """Compute buffer bytes per row (device names, `Host` for the CPU), or None without a builder.
    `n_outputs_max`: the context's output rows (llama-context.cpp cparams.n_outputs_max; None is
    n_batch, llama.cpp's default when the caller sets none). `dry_run`: llama-fit-params' reserve
    (True) or a real load's (llama-server, llama-cli: ModelRunner.reserve says how they differ)."""
    found = _reserved(settings, n_outputs_max, dry_run)
    return dict(found.compute) if found is not None else None


def decode_kernels(settings: LlamaSettings, n_outputs_max: int | None = None,
                   dry_run: bool = True) -> dict[str, int] | None:
    """Per device name (`CPU` for the host), the nodes of the one-token graph the scheduler put there that run
    an op (Scheduler.kernel_nodes), from the same reserve as reserve_compute; None without a builder."""
    found = _reserved(settings, n_outputs_max, dry_run)
    return dict(found.kernels) if found is not None else None


def decode_splits(settings: LlamaSettings, n_outputs_max: int | None = None, dry_run: bool = True) -> int | None:
    """Splits of the one-token graph as the scheduler cut them (seed 000: a high count at generation time is the
    cheap signal that something is misplaced), from the same reserve as reserve_compute; None without a builder."""
    found = _reserved(settings, n_outputs_max, dry_run)
    return found.n_splits_tg if found is not None else None


@dataclass(frozen=True)
class _Reserved:
    compute: dict[str, int]    # bytes per breakdown row
    kernels: dict[str, int]    # op nodes of the one-token graph per device name
    n_splits_tg: int = 0       # splits of the one-token graph (llama.cpp's "graph splits" of the tg reserve)


def _reserved(settings: LlamaSettings, n_outputs_max: int | None, dry_run: bool) -> _Reserved | None:
    if os.environ.get(ANALYTIC_ENV) == "analytic" or not supported(settings):
        return None
    key = (*_key(settings, n_outputs_max), dry_run)
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        return hit
    try:
        with _collector_paused():
            runner = ModelRunner(settings, {}, n_outputs_max)
            runner.load_weights(copy_data=False)
            runner.alloc_kv()
            report = runner.reserve(dry_run)
    except (FitplanError, ValueError, KeyError) as e:
        log.info("runtime reserve unavailable (%s); the analytic compute model applies", e)
        return None
    found = _Reserved({row_of(name): size for name, size in report.compute_bytes.items()}, dict(report.tg_kernels),
                      report.n_splits_tg)
    return _remember(_cache, key, found)


T = TypeVar("T")


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The reserve makes tens of thousands of small objects that stay alive until it returns, so
    the cyclic collector's passes over them find nothing; pausing it saves ~20% of the call."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _remember(cache: OrderedDict[tuple, T], key: tuple, found: T) -> T:
    """`found` stored as the newest entry of a least-recently-used cache of CACHE_SIZE entries."""
    cache[key] = found
    if len(cache) > CACHE_SIZE:
        cache.popitem(last=False)
    return found


# mtp: the draft-mtp context's compute buffers (runtime/engine/mtp_graph.py), cached as the target's are
_mtp_cache: OrderedDict[tuple, dict[str, int]] = OrderedDict()


def reserve_mtp_compute(settings: LlamaSettings, n_outputs_max: int) -> dict[str, int] | None:
    """Compute buffer bytes per row of the MTP draft context llama-server makes on the target's model
    (`settings`: the target's flags with that context's n_ctx and cache types), or None where the runtime
    has no MTP head for the architecture. Always a real load's reserve: only llama-server makes it."""
    if os.environ.get(ANALYTIC_ENV) == "analytic" or settings.ctx.model.architecture not in MTP_GRAPHS:
        return None
    key = (*_key(settings, n_outputs_max), settings.flags.spec.draft.backend_sampling)
    hit = _mtp_cache.get(key)
    if hit is not None:
        _mtp_cache.move_to_end(key)
        return hit
    with _collector_paused():
        runner = MtpRunner(settings, n_outputs_max, settings.flags.spec.draft.backend_sampling)
        runner.load_weights(copy_data=False)
        runner.alloc_kv()
        report = runner.reserve(dry_run=False)
    return _remember(_mtp_cache, key, {row_of(name): size for name, size in report.compute_bytes.items()})
