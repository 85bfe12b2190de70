"""The solver's side of `fitplan plan`: a setting (flags without placement, devices, budgets),
its per-layer demands measured with the estimate's own building blocks, the llama.cpp flags an
assignment stands for, and the loop that solves, estimates those flags and corrects.

The estimate is the judge: if any device or the host comes out over budget, the solver's figure for
that slot is corrected by the difference and the problem solved again, so a plan and its estimate
can never disagree.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace

from planner.hardware.budgets import Budgets
from planner.hardware.inventory import Inventory, same_cards
from planner.llama.commands import PLANNED_PROGRAM
from planner.llama.context import ModelContext
from planner.llama.flags import FFN_EXPS_REGEX, NGL_AUTO, LlamaFlags, OverrideArg, OverrideKind, arg
from planner.llama.kv import layer_caches
from planner.llama.overhead import device_overhead
from planner.llama.placement import CPU, HOST, HOST_ROWS, INPUT_LAYER, Device
from planner.llama.settings import LlamaSettings, resolve_on, resolve_settings
from planner.memory.estimate import Estimate, estimate
from planner.model.costs import CostTable, cost_table
from planner.model.tensors import OUTPUT
from planner.search.companion_plan import companion_flags
from planner.search.result import PlanRequest
from planner.search.solve import Assignment, LayerDemand, Problem, Slot, solve
from planner.speed.throughput import Rates, expert_fraction, layer_decode_bytes

log = logging.getLogger(__name__)

MAX_CORRECTIONS = 8
_EXPS = re.compile(FFN_EXPS_REGEX)


@dataclass(frozen=True)
class LayerWeights:
    weights: list[int]     # bytes per layer 0..n_layer_all (the last is the output layer)
    experts: list[int]     # the routed-expert part of each
    input_bytes: int       # the input tensors, which always stay in host memory


def layer_weights(ctx: ModelContext, flags: LlamaFlags) -> LayerWeights:
    """Weight bytes per layer that llama.cpp allocates under these flags (nextn blocks: none unless
    loaded, planner/llama/nextn.py), their routed-expert part, and the input tensors' bytes."""
    n = ctx.facts.n_layer_all
    weights, experts, host = [0] * (n + 1), [0] * (n + 1), 0
    for slot in ctx.loaded_slots(flags):
        if slot.layer == INPUT_LAYER:
            host += slot.n_bytes
            continue
        weights[slot.layer] += slot.n_bytes
        if slot.layer < n and _EXPS.search(slot.name):
            experts[slot.layer] += slot.n_bytes
    return LayerWeights(weights, experts, host)


def layer_kv(ctx: ModelContext, flags: LlamaFlags, devices: tuple[Device, ...]) -> list[int]:
    """Context bytes of each layer, sized exactly as the estimate sizes them: the estimate's own
    settings for every layer on the first device (-ngl all -ts 1,0,...), or on the CPU without one."""
    n = ctx.facts.n_layer_all
    first = replace(flags, n_gpu_layers=NGL_AUTO, tensor_split=(1.0,) + (0.0,) * (len(devices) - 1) if devices else ())
    out = [0] * (n + 1)
    for cache in layer_caches(resolve_on(ctx, first, devices)):
        out[cache.layer] += cache.bytes
    return out


@dataclass(frozen=True)
class Setting:
    """Everything fixed while the solver decides layers: flags without placement, devices, budgets."""

    ctx: ModelContext
    costs: CostTable
    flags: LlamaFlags
    devices: tuple[Device, ...]
    inventory: Inventory
    budgets: Budgets
    request: PlanRequest
    base: LlamaSettings          # the flags resolved once: their devices and context params
    output_on_host: bool = False


@dataclass(frozen=True)
class Probes:
    """What the solver needs beyond the tensor list, measured once per setting with the estimate."""

    weights: list[int]           # per layer 0..n_layer_all (output last)
    experts: list[int]
    kv: list[int]
    device_compute: dict[str, int]
    output_extra: int            # what the output device computes beyond the others (the logits)
    host_fixed: int              # input tensors, the CPU compute buffer, KV kept on the host
    companion_fixed: dict[str, int] = field(default_factory=dict)   # drafter + projector bytes per device


def probe(s: Setting) -> Probes:
    lw = layer_weights(s.ctx, s.flags)
    weights, experts, inputs = lw.weights, lw.experts, lw.input_bytes
    kv = layer_kv(s.ctx, s.flags, s.devices)
    probes = [estimate(s.ctx, replace(s.flags, n_gpu_layers=0), s.inventory, exact_compute=False,
                       program=PLANNED_PROGRAM)]
    per_device, extra = {}, 0
    if s.devices:
        full = estimate(s.ctx, with_output(s, replace(s.flags, n_gpu_layers=s.ctx.facts.n_layer_all + 1)),
                        s.inventory, exact_compute=False, program=PLANNED_PROGRAM)
        probes.append(full)
        compute = {d.name: d.compute_bytes for d in full.devices}
        others = [compute[d.name] for d in s.devices if d.name != full.output_device]
        base = max(others) if others else 0
        extra = max(0, compute.get(full.output_device, 0) - base) if others else 0
        per_device = {d.name: (base if others else compute.get(d.name, 0)) for d in s.devices}
    host_compute = max(d.compute_bytes for p in probes for d in p.devices if d.name == HOST)
    fixed = fixed_companion_bytes(probes[-1])
    host_fixed = (inputs + host_compute + (0 if s.flags.kv_offload else sum(kv))
                  + (weights[-1] if s.output_on_host else 0) + fixed.pop(HOST, 0))
    return Probes(weights, experts, kv, per_device, extra, host_fixed, fixed)


def overhead_bytes(device: Device, inventory: Inventory) -> int:
    o = device_overhead(device, inventory)
    return 0 if o is None else o.bytes


def fixed_companion_bytes(est: Estimate) -> dict[str, int]:
    """The drafter's and the projector's bytes per budget row (HOST for every host row): fixed while
    the target's layers move, as each is pinned to its own device. Adapters follow the layers they
    patch, draft-mtp's context the nextn block; the estimate's correction rounds count them."""
    out: dict[str, int] = {}
    for c in est.companions:
        if c.kind in ("lora", "mtp"):   # the MTP context's KV follows its nextn block
            continue
        for d in c.devices:
            row = HOST if d.name in HOST_ROWS else d.name
            out[row] = out.get(row, 0) + d.total_bytes
    return out


def build_problem(s: Setting, probes: Probes, correction: dict[str, int]) -> Problem:
    """The solver's view: one demand per layer and one slot per place, corrected per slot."""
    facts = s.ctx.facts
    weights, experts, kv = probes.weights, probes.experts, probes.kv
    compute, out_extra = probes.device_compute, probes.output_extra
    frac = expert_fraction(facts.n_expert, facts.n_expert_used)
    n_ctx = s.base.cparams.n_ctx_seq
    demands = []
    read: float
    for il in range(facts.n_layer_all + 1):
        dev_kv = kv[il] if s.flags.kv_offload else 0
        if il < facts.n_layer_all and facts.layers[il].nextn:   # MTP blocks are not run for plain decoding
            read, expert_read = 0.0, 0
        elif il < facts.n_layer_all:
            read, expert_read = layer_decode_bytes(s.costs.layers[il], n_ctx, frac, s.flags.n_parallel)
        elif s.output_on_host:  # the output matrix and the logits stay in host memory
            read, expert_read = 0.0, 0
        else:
            read, expert_read = float(weights[il]), 0
        on_device = 0 if (il == facts.n_layer_all and s.output_on_host) else weights[il]
        demands.append(LayerDemand(
            device_bytes=on_device + dev_kv + (out_extra if il == facts.n_layer_all else 0),
            expert_bytes=experts[il], read_bytes=max(read, 0.0), expert_read_bytes=float(expert_read)))
    rates = Rates(s.inventory)   # the throughput model's figures and fallbacks
    host_budget = s.budgets.host_bytes - probes.host_fixed - correction.get(HOST, 0)
    slots = [Slot(CPU, max(host_budget, -1), rates.bandwidth(CPU), 0, 0.0)]
    for d in s.devices:
        # a companion pinned here holds its bytes whether or not the target puts layers here; the process
        # holds its overhead on every device of its list (planner/llama/overhead.py)
        budget = (s.budgets.devices.get(d.name, 0) - probes.companion_fixed.get(d.name, 0)
                  - overhead_bytes(d, s.inventory))
        slots.append(Slot(d.name, budget, rates.bandwidth(d.name),
                          compute.get(d.name, 0) + correction.get(d.name, 0), rates.latency(d.name),
                          pooled=d.name in s.budgets.pool_devices))
    return Problem(tuple(demands), tuple(slots), s.request.allow_expert_offload)


# ---------------------------------------------------------------------------------------------
# from an assignment to llama.cpp flags, and back through the estimate


def expert_override(layers: frozenset[int]) -> OverrideArg | None:
    if not layers:
        return None
    if layers == frozenset(range(len(layers))):
        return OverrideArg(OverrideKind.NCMOE, str(len(layers)))   # -ncmoe N: the first N layers' experts
    ids = "|".join(str(i) for i in sorted(layers))
    return OverrideArg(OverrideKind.OT, rf"blk\.({ids}){FFN_EXPS_REGEX}=CPU")


def output_override(ctx: ModelContext) -> OverrideArg:
    r"""Keep the output matrix in host memory. A tied output is llama.cpp's duplicate of token_embd
    and an -ot rule sees it under that name (checked against llama-fit-params). Anchored: llama.cpp
    matches -ot with std::regex_search (llama-model-loader.cpp), so a bare `output\.weight` would
    also move every blk.N.attn_output.weight."""
    tied = ctx.model.tensor(OUTPUT) is None
    return OverrideArg(OverrideKind.OT, r"^token_embd\.weight=CPU" if tied else r"^output\.weight=CPU")


def with_output(s: Setting, flags: LlamaFlags) -> LlamaFlags:
    if not s.output_on_host:
        return flags
    return replace(flags, override_args=flags.override_args + (output_override(s.ctx),))


def flags_for(s: Setting, a: Assignment) -> LlamaFlags:
    """llama.cpp flags that reproduce an assignment: -ngl, integer -ts counts, -ot for experts."""
    n_slots = len(s.devices) + 1
    counts = a.counts(n_slots)
    ngl = len(a.slot_of_layer) - counts[0] if s.devices else 0
    override = expert_override(a.experts_on_host)
    flags = replace(s.flags, n_gpu_layers=ngl,
                    tensor_split=tuple(float(c) for c in counts[1:]) if len(s.devices) > 1 and ngl else (),
                    override_args=(override,) if override else ())
    return with_output(s, flags) if ngl else flags


def overuse(s: Setting, est: Estimate) -> dict[str, int]:
    """Bytes over budget per device (llama.cpp names) and on the host (Host + CPU_REPACK); Host also
    carries what Host and the UMA devices use together beyond their shared pool."""
    return s.budgets.over(row_totals(est))


def row_totals(est: Estimate) -> dict[str, int]:
    """Bytes per budget row: each device's under its name, every host row (Host, CPU_REPACK) summed
    under HOST; the companions' rows added to the target's; each device's overhead outside the breakdown
    (planner/llama/overhead.py) added to its row."""
    rows = est.totals   # every model the process loads: the target and its companions
    totals = {d.name: d.held_bytes for d in rows if d.name not in HOST_ROWS}   # the overhead held with it
    totals[HOST] = sum(d.total_bytes for d in rows if d.name in HOST_ROWS)
    return totals


@dataclass(frozen=True)
class Verified:
    """A solver's assignment whose flags the estimate confirmed within every budget."""

    assignment: Assignment
    flags: LlamaFlags
    estimate: Estimate
    rounds: int            # solve-and-correct rounds it took


def solve_verified(s: Setting, exact: bool = False) -> Verified | None:
    """Solve, check with the estimate, correct the over-budget slots, repeat. The search checks with
    the analytic compute model; `exact` checks with the estimate as `fitplan estimate` reports it
    (the runtime's allocator where a graph builder exists), which is slower."""
    correction: dict[str, int] = {}
    probes = cached_probe(s)
    for rounds in range(1, MAX_CORRECTIONS + 1):
        problem = build_problem(s, probes, correction)
        a = solve(problem, s.request.objective, s.request.solver)
        if a is None:
            return None
        flags = flags_for(s, a)
        est = estimate(s.ctx, flags, s.inventory, exact_compute=exact, program=PLANNED_PROGRAM)
        over = overuse(s, est)
        if not over:
            return Verified(a, flags, est, rounds)
        # Every device the solver under-counted is corrected at once, by its own error, so that one
        # more round usually settles it (each exact round is a fresh allocator reserve).
        predicted = device_use(problem, a)
        for d in est.totals:
            error = d.total_bytes - predicted.get(d.name, d.total_bytes)
            if error > 0:
                correction[d.name] = correction.get(d.name, 0) + error
        if HOST in over:
            correction[HOST] = correction.get(HOST, 0) + over[HOST]
        log.info("round %d over budget on %s; correcting", rounds, ", ".join(over))
    return None


# (flags, output on host, inventory) -> probes, for one model context at a time: the probes do not
# depend on the budgets, and the what-would-fit search (planner/search/whatfits.py) plans the same
# settings under a dozen budgets
PROBE_CACHE: dict[tuple[LlamaFlags, bool, Inventory], tuple[ModelContext, Probes]] = {}
PROBE_CACHE_SIZE = 256


def cached_probe(s: Setting) -> Probes:
    key = (s.flags, s.output_on_host, s.inventory)
    entry = PROBE_CACHE.get(key)
    if entry is None or entry[0] is not s.ctx:
        if len(PROBE_CACHE) >= PROBE_CACHE_SIZE or any(c is not s.ctx for c, _ in PROBE_CACHE.values()):
            PROBE_CACHE.clear()
        entry = PROBE_CACHE[key] = (s.ctx, probe(s))
    return entry[1]


def device_use(problem: Problem, a: Assignment) -> dict[str, int]:
    """Bytes the solver's figures put on each used device slot."""
    use: dict[str, int] = {}
    for il, slot in enumerate(a.slot_of_layer):
        if slot == 0:
            continue
        layer = problem.layers[il]
        name = problem.slots[slot].name
        use[name] = use.get(name, 0) + layer.device_bytes - (layer.expert_bytes if il in a.experts_on_host else 0)
    for device_slot in problem.slots[1:]:
        if device_slot.name in use:
            use[device_slot.name] += device_slot.fixed_bytes
    return use


# (context, cache type) -> cost table, for one model context at a time; the context is kept in
# the entry, so a new context that reuses a freed one's id() can never match
COST_CACHE: dict[tuple[int, str], tuple[ModelContext, CostTable]] = {}


def costs_for(ctx: ModelContext, cache: str) -> CostTable:
    """The cost table depends only on the model and the cache type: built once per model (a
    sweep's plans at every point share it)."""
    entry = COST_CACHE.get((id(ctx), cache))
    if entry is None or entry[0] is not ctx:
        if any(c is not ctx for c, _ in COST_CACHE.values()):
            COST_CACHE.clear()
        entry = COST_CACHE[(id(ctx), cache)] = (ctx, cost_table(ctx.model, ctx.facts, cache, cache))
    return entry[1]


def make_setting(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest,
             n_ctx: int, cache: str, n_ubatch: int = 512, output_on_host: bool = False,
             op_offload: bool = True) -> Setting:
    rpc = tuple(d.endpoint for d in inventory.devices if d.endpoint)
    # a card a second backend repeats (CUDA0 and Vulkan0 with one id) is used once, by the name
    # llama.cpp keeps (llama_prepare_model_devices): -dev names every other device
    repeated = {same.skipped for same in same_cards(inventory.devices)}
    names = tuple(n for n in inventory.names if n not in repeated)

    base = LlamaFlags(n_ctx=n_ctx, n_parallel=req.n_parallel, n_ubatch=n_ubatch, cache_type_k=cache,
                      cache_type_v=cache, flash_attn=req.flash_attn, rpc=rpc, op_offload=op_offload,
                      devices=names if names else None, ignored=tuple(arg("fit", "off")))
    base = companion_flags(base, req.companions) if req.companions.any else base
    resolved = resolve_settings(ctx, base, inventory)
    devices = resolved.devices
    costs = costs_for(ctx, cache)
    return Setting(ctx, costs, base, devices, inventory, budgets, req, resolved, output_on_host and bool(devices))
