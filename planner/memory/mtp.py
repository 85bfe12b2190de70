"""draft-mtp's context (`--spec-type draft-mtp` without `-md`): what the pinned llama-server allocates
for it on each device, beside the target's own rows.

llama-server makes a second llama_context on the target's model (common/speculative.cpp
common_speculative_init_result; tools/server/server-context.cpp load_model). It shares the target's
weights (the nextn blocks are loaded with their layer: planner/llama/nextn.py) and holds:
- KV: a plain cache of the nextn blocks alone (llama-model.cpp create_memory, LLAMA_CONTEXT_TYPE_MTP:
  layer filter il >= n_layer, also for a hybrid trunk), as many cells as the target's resolved context
  (cparams.n_ctx = llama_n_ctx(ctx_tgt)), of the -ctkd / -ctvd types (common_base_params_to_speculative),
  the target's -np / -kvu / -fa / -nkvo, on the device of the block (planner.llama.kv.layer_caches, nextn);
- compute: the architecture's MTP head (LLM_GRAPH_TYPE_DECODER_MTP) with one output row per sequence
  (n_outputs_max = -np) and the draft's top-k sampler on the backend, reserved as a real load does
  (runtime/engine/mtp_graph.py).
llama-fit-params takes no --spec-type, and the target's -fit (common_fit_params) measures this context
as an extra model sharing the weights; fitplan sizes it for llama-server (planner/llama/programs.py).

An architecture whose MTP head the runtime does not build is refused with its reason rather than sized
by a guess; so is a file without nextn blocks (llama_init_from_model returns no context: "context type
MTP requested but model doesn't contain MTP layers", and llama-server stops).
"""
from __future__ import annotations

from dataclasses import replace

from planner.core.errors import FlagError
from planner.llama.companions import target_n_rs_seq
from planner.llama.context import ModelContext
from planner.llama.kv import context_bytes, layer_caches
from planner.llama.nextn import MTP_ARCHS
from planner.llama.placement import HOST
from planner.llama.settings import LlamaSettings, resolve_on
from planner.memory.analytic import SIMULATED
from planner.memory.rows import CompanionEstimate, DeviceMemory
from runtime.engine.mtp_graph import MTP_GRAPHS
from runtime.engine.reserve import reserve_mtp_compute

MTP = "mtp"   # CompanionEstimate.kind


def mtp_settings(target: LlamaSettings) -> LlamaSettings:
    """The MTP context's settings: the target's flags and devices with the target's resolved n_ctx and the
    drafter's cache types (-ctkd / -ctvd)."""
    d = target.flags.spec.draft
    flags = replace(target.flags, n_ctx=target.cparams.n_ctx, cache_type_k=d.cache_type_k,
                    cache_type_v=d.cache_type_v)
    return resolve_on(target.ctx, flags, target.devices)


def check_mtp(target: ModelContext) -> None:
    """FlagError where llama-server would not make the MTP context on this model, or fitplan cannot size it."""
    model, facts = target.model, target.facts
    arch = model.architecture
    n_nextn = sum(1 for lf in facts.layers if lf.nextn)
    if not n_nextn:
        raise FlagError(f"--spec-type draft-mtp: {model.path} has no next-token-prediction block "
                        f"({arch}.nextn_predict_layers is 0); llama.cpp makes no MTP context ('context type MTP "
                        f"requested but model doesn't contain MTP layers') and llama-server stops: use a file "
                        f"converted with its MTP layers, or a drafter (-md)")
    if arch not in MTP_ARCHS:
        raise FlagError(f"--spec-type draft-mtp: llama.cpp has no MTP draft head for {arch} (its nextn blocks are "
                        f"never loaded: src/models/{arch}.cpp builds no LLM_GRAPH_TYPE_DECODER_MTP graph)")
    if arch not in MTP_GRAPHS:
        raise FlagError(f"--spec-type draft-mtp: fitplan does not size {arch}'s MTP draft context yet (its graph "
                        f"is simulated for {', '.join(sorted(MTP_GRAPHS))}); estimate without it, and keep "
                        f"room for one more layer's KV and compute buffer")
    if n_nextn != 1:
        raise FlagError(f"--spec-type draft-mtp: {arch}'s MTP head runs one nextn block and the file has "
                        f"{n_nextn} (llama.cpp asserts n_layer_nextn == 1)")


def estimate_mtp(target: LlamaSettings) -> CompanionEstimate:
    """The MTP context's rows, named as the target's (its devices in llama.cpp's order, then Host); its
    weights are the target's, so the model column is 0."""
    check_mtp(target.ctx)
    settings = mtp_settings(target)
    kv = context_bytes(layer_caches(settings, nextn=True))
    measured = reserve_mtp_compute(settings, target.flags.n_parallel)
    compute = {} if measured is None else measured
    names = [d.name for d in settings.devices] + [HOST]
    rows = tuple(DeviceMemory(n, 0, kv.get(n, 0), compute.get(n, 0)) for n in names)
    return CompanionEstimate(MTP, settings.ctx.model.path, rows, SIMULATED, mtp_notes(target))


def mtp_notes(target: LlamaSettings) -> tuple[str, ...]:
    """What llama-server does beside allocating the context."""
    notes = ["the MTP head drafts with the target's own weights (its nextn block is loaded with the model)"]
    n_rs_seq = target_n_rs_seq(target.ctx.facts.arch, target.flags)
    if n_rs_seq and any(lf.state_r or lf.state_s for lf in target.ctx.facts.layers):
        notes.append(f"the target's recurrent states keep {n_rs_seq} rollback rows per sequence "
                     f"(--spec-draft-n-max): its context row includes them")
    return tuple(notes)
