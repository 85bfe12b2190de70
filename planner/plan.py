"""`fitplan plan`: the best llama.cpp placement for a model on an inventory under budgets.

Pipeline: the model read once → per-layer demands (weights from the tensor list, KV from the same
`kv.layer_caches` estimate uses, compute buffers from an estimate probe) → `solve.solve_dp` →
llama.cpp flags → `estimate` on exactly those flags. The estimate is the judge: if any device
or the host comes out over budget, the solver's figure for that slot is corrected by the
difference and the problem solved again, so a plan and its estimate can never disagree.
"""
from __future__ import annotations

import hashlib
import logging
import math
import re
from dataclasses import dataclass, field, replace

from planner.budgets import Budgets, resolve_budgets
from planner.costs import CostTable, cost_table
from planner.devices import Inventory
from planner.errors import BadInput, InfeasiblePlacement, Shortfall
from planner.estimate import Estimate, ModelContext, estimate, model_context
from planner.flags import FFN_EXPS_REGEX, LlamaFlags, OverrideArg
from planner.kv import CTX_PAD, context_params, layer_caches
from planner.placement import CPU_REPACK, HOST, INPUT_LAYER, Device, Placement, resolve_devices
from planner.solve import Assignment, LayerDemand, Objective, Problem, Slot, solve_dp
from planner.throughput import (CPU, FALLBACK_DEVICE_BANDWIDTH, FALLBACK_HOST_BANDWIDTH, LOCAL_SPLIT_LATENCY_S,
                                RPC_SPLIT_LATENCY_S, PlacementView, Prediction, layer_decode_bytes, predict)

log = logging.getLogger(__name__)

MAX_CORRECTIONS = 8
_EXPS = re.compile(FFN_EXPS_REGEX)


@dataclass(frozen=True)
class PlanRequest:
    """What the user asks for; every field has llama.cpp's default where it has one."""

    n_ctx: int | None = None        # None: the training context (llama.cpp's -c 0)
    max_ctx: bool = False           # search the largest context that fits (--ctx max)
    n_parallel: int = 1
    objective: Objective = Objective.THROUGHPUT
    cache_types: tuple[str, ...] = ("f16",)   # tried in order until one fits
    n_ubatch: int | None = None     # None: 512, or smaller when that lets more layers onto devices
    flash_attn: str = "auto"
    allow_expert_offload: bool = True
    allow_output_on_host: bool = True


# -ub values tried when the user leaves it open: llama.cpp's default first, then halves down to
# ggml's op-offload batch threshold (below it, prompt matmuls on host weights stop offloading).
UBATCH_CANDIDATES = (512, 256, 128, 64, 32)


@dataclass(frozen=True)
class PlanResult:
    model_path: str
    header_sha256: str
    inventory: Inventory
    budgets: Budgets
    request: PlanRequest
    flags: LlamaFlags
    estimate: Estimate
    prediction: Prediction
    experts_on_host: frozenset[int]
    solve_rounds: int
    explain: tuple[str, ...] = field(default=())

    @property
    def n_ctx(self) -> int:
        return self.estimate.cparams.n_ctx

    def budget_of(self, row: str) -> int:
        return self.budgets.host_bytes if row in (HOST, CPU_REPACK) else self.budgets.devices.get(row, 0)

    def to_dict(self) -> dict:
        from planner.plan_report import plan_dict

        return plan_dict(self)

    def to_table(self) -> str:
        from planner.plan_report import plan_table

        return plan_table(self)


def header_sha256(path: str, n_bytes: int) -> str:
    """sha256 of the GGUF header (metadata and tensor index, not the weights)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(n_bytes))
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# demands: what each layer and each slot costs, from the estimate's own building blocks


def _layer_weights(ctx: ModelContext) -> tuple[list[int], list[int], int]:
    """Weight bytes per layer 0..n_layer_all (the last is the output layer), the routed-expert part
    of each, and the input tensors that always stay in host memory."""
    n = ctx.facts.n_layer_all
    weights, experts, host = [0] * (n + 1), [0] * (n + 1), 0
    for slot in ctx.slots:
        if slot.layer == INPUT_LAYER:
            host += slot.n_bytes
            continue
        weights[slot.layer] += slot.n_bytes
        if slot.layer < n and _EXPS.search(slot.name):
            experts[slot.layer] += slot.n_bytes
    return weights, experts, host


def _layer_kv(ctx: ModelContext, flags: LlamaFlags, devices: tuple[Device, ...]) -> list[int]:
    """Context bytes of each layer, sized exactly as the estimate sizes them."""
    n = ctx.facts.n_layer_all
    name = devices[0].name if devices else CPU
    fake = Placement(devices, tuple([name] * (n + 1)), (), (), 0, False)
    cp = context_params(flags, ctx.facts.n_ctx_train)
    out = [0] * (n + 1)
    for cache in layer_caches(ctx.facts, flags, cp, fake, {d.name: d.alignment for d in devices}):
        out[cache.layer] += cache.bytes
    return out


@dataclass(frozen=True)
class _Setting:
    """Everything fixed while the solver decides layers: flags without placement, devices, budgets."""

    ctx: ModelContext
    costs: CostTable
    flags: LlamaFlags
    devices: tuple[Device, ...]
    inventory: Inventory
    budgets: Budgets
    request: PlanRequest
    output_on_host: bool = False


@dataclass(frozen=True)
class _Probes:
    """What the solver needs beyond the tensor list, measured once per setting with the estimate."""

    weights: list[int]           # per layer 0..n_layer_all (output last)
    experts: list[int]
    kv: list[int]
    device_compute: dict[str, int]
    output_extra: int            # what the output device computes beyond the others (the logits)
    host_fixed: int              # input tensors, the CPU compute buffer, KV kept on the host


def _probe(s: _Setting) -> _Probes:
    weights, experts, inputs = _layer_weights(s.ctx)
    kv = _layer_kv(s.ctx, s.flags, s.devices)
    probes = [estimate(s.ctx, replace(s.flags, n_gpu_layers=0), s.inventory, exact_compute=False)]
    per_device, extra = {}, 0
    if s.devices:
        full = estimate(s.ctx, _with_output(s, replace(s.flags, n_gpu_layers=s.ctx.facts.n_layer_all + 1)),
                        s.inventory, exact_compute=False)
        probes.append(full)
        compute = {d.name: d.compute_bytes for d in full.devices}
        others = [compute[d.name] for d in s.devices if d.name != full.output_device]
        base = max(others) if others else 0
        extra = max(0, compute.get(full.output_device, 0) - base) if others else 0
        per_device = {d.name: (base if others else compute.get(d.name, 0)) for d in s.devices}
    host_compute = max(d.compute_bytes for p in probes for d in p.devices if d.name == HOST)
    host_fixed = (inputs + host_compute + (0 if s.flags.kv_offload else sum(kv))
                  + (weights[-1] if s.output_on_host else 0))
    return _Probes(weights, experts, kv, per_device, extra, host_fixed)


def build_problem(s: _Setting, probes: _Probes, correction: dict[str, int]) -> Problem:
    """The solver's view: one demand per layer and one slot per place, corrected per slot."""
    facts = s.ctx.facts
    weights, experts, kv = probes.weights, probes.experts, probes.kv
    compute, out_extra = probes.device_compute, probes.output_extra
    frac = facts.n_expert_used / facts.n_expert if facts.n_expert else 0.0
    n_ctx = context_params(s.flags, facts.n_ctx_train).n_ctx_seq
    demands = []
    for il in range(facts.n_layer_all + 1):
        dev_kv = kv[il] if s.flags.kv_offload else 0
        if il < facts.n_layer_all:
            read, expert_read = layer_decode_bytes(s.costs.layers[il], n_ctx, frac, s.flags.n_parallel)
        elif s.output_on_host:  # the output matrix and the logits stay in host memory
            read, expert_read = 0.0, 0
        else:
            read, expert_read = float(weights[il]), 0
        on_device = 0 if (il == facts.n_layer_all and s.output_on_host) else weights[il]
        demands.append(LayerDemand(
            device_bytes=on_device + dev_kv + (out_extra if il == facts.n_layer_all else 0),
            expert_bytes=experts[il], read_bytes=max(read, 0.0), expert_read_bytes=float(expert_read)))
    host_bw = s.inventory.host.bandwidth_bytes_s or FALLBACK_HOST_BANDWIDTH
    host_budget = s.budgets.host_bytes - probes.host_fixed - correction.get(HOST, 0)
    slots = [Slot(CPU, max(host_budget, -1), host_bw, 0, 0.0)]
    specs = {d.name: d for d in s.inventory.devices}
    for d in s.devices:
        spec = specs.get(d.name)
        bw = (spec.bandwidth_bytes_s if spec else 0) or FALLBACK_DEVICE_BANDWIDTH
        latency = RPC_SPLIT_LATENCY_S if d.endpoint else LOCAL_SPLIT_LATENCY_S
        slots.append(Slot(d.name, s.budgets.devices.get(d.name, 0), bw,
                          compute.get(d.name, 0) + correction.get(d.name, 0), latency))
    return Problem(tuple(demands), tuple(slots), s.request.allow_expert_offload)


# ---------------------------------------------------------------------------------------------
# from an assignment to llama.cpp flags, and back through the estimate


def _expert_override(layers: frozenset[int]) -> OverrideArg | None:
    if not layers:
        return None
    if layers == frozenset(range(len(layers))):
        return OverrideArg("ncmoe", str(len(layers)))   # -ncmoe N: the first N layers' experts
    ids = "|".join(str(i) for i in sorted(layers))
    return OverrideArg("ot", rf"blk\.({ids}){FFN_EXPS_REGEX}=CPU")


def _output_override(ctx: ModelContext) -> OverrideArg:
    """Keep the output matrix in host memory. A tied output is llama.cpp's duplicate of token_embd
    and an -ot rule sees it under that name (checked against llama-fit-params). Anchored: llama.cpp
    matches -ot with std::regex_search (llama-model-loader.cpp), so a bare `output\.weight` would
    also move every blk.N.attn_output.weight."""
    tied = ctx.model.tensor("output.weight") is None
    return OverrideArg("ot", r"^token_embd\.weight=CPU" if tied else r"^output\.weight=CPU")


def _with_output(s: _Setting, flags: LlamaFlags) -> LlamaFlags:
    if not s.output_on_host:
        return flags
    return replace(flags, override_args=flags.override_args + (_output_override(s.ctx),))


def flags_for(s: _Setting, a: Assignment) -> LlamaFlags:
    """llama.cpp flags that reproduce an assignment: -ngl, integer -ts counts, -ot for experts."""
    n_slots = len(s.devices) + 1
    counts = a.counts(n_slots)
    ngl = len(a.slot_of_layer) - counts[0] if s.devices else 0
    override = _expert_override(a.experts_on_host)
    flags = replace(s.flags, n_gpu_layers=ngl,
                    tensor_split=tuple(float(c) for c in counts[1:]) if len(s.devices) > 1 and ngl else (),
                    override_args=(override,) if override else ())
    return _with_output(s, flags) if ngl else flags


def overuse(s: _Setting, est: Estimate) -> dict[str, int]:
    """Bytes over budget per device (llama.cpp names) and on the host (Host + CPU_REPACK)."""
    over: dict[str, int] = {}
    host = sum(d.total_bytes for d in est.devices if d.name in (HOST, CPU_REPACK))
    if host > s.budgets.host_bytes:
        over[HOST] = host - s.budgets.host_bytes
    for d in est.devices:
        if d.name in s.budgets.devices and d.total_bytes > s.budgets.devices[d.name]:
            over[d.name] = d.total_bytes - s.budgets.devices[d.name]
    return over


def _solve_verified(s: _Setting, exact: bool = False) -> tuple[Assignment, LlamaFlags, Estimate, int] | None:
    """Solve, check with the estimate, correct the over-budget slots, repeat. The search checks with
    the analytic compute model; `exact` checks with the estimate as `fitplan estimate` reports it
    (the runtime's allocator where a graph builder exists), which is slower."""
    correction: dict[str, int] = {}
    probes = _probe(s)
    for rounds in range(1, MAX_CORRECTIONS + 1):
        problem = build_problem(s, probes, correction)
        a = solve_dp(problem, s.request.objective)
        if a is None:
            return None
        flags = flags_for(s, a)
        est = estimate(s.ctx, flags, s.inventory, exact_compute=exact)
        over = overuse(s, est)
        if not over:
            return a, flags, est, rounds
        # Every device the solver under-counted is corrected at once, by its own error, so that one
        # more round usually settles it (each exact round is a fresh allocator reserve).
        predicted = _device_use(problem, a)
        for d in est.devices:
            error = d.total_bytes - predicted.get(d.name, d.total_bytes)
            if error > 0:
                correction[d.name] = correction.get(d.name, 0) + error
        if HOST in over:
            correction[HOST] = correction.get(HOST, 0) + over[HOST]
        log.info("round %d over budget on %s; correcting", rounds, ", ".join(over))
    return None


def _device_use(problem: Problem, a: Assignment) -> dict[str, int]:
    """Bytes the solver's figures put on each used device slot."""
    use: dict[str, int] = {}
    for il, slot in enumerate(a.slot_of_layer):
        if slot == 0:
            continue
        layer = problem.layers[il]
        name = problem.slots[slot].name
        use[name] = use.get(name, 0) + layer.device_bytes - (layer.expert_bytes if il in a.experts_on_host else 0)
    for slot in problem.slots[1:]:
        if slot.name in use:
            use[slot.name] += slot.fixed_bytes
    return use


_COSTS: dict[tuple[int, str], CostTable] = {}


def _costs(ctx: ModelContext, cache: str) -> CostTable:
    """The cost table depends only on the model and the cache type: build it once per plan."""
    key = (id(ctx), cache)
    if key not in _COSTS:
        _COSTS.clear()  # one model at a time; ids are only unique among live objects
        _COSTS[key] = cost_table(ctx.model, ctx.facts, cache, cache)
    return _COSTS[key]


def _setting(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest,
             n_ctx: int, cache: str, n_ubatch: int = 512, output_on_host: bool = False) -> _Setting:
    rpc = tuple(d.endpoint for d in inventory.devices if d.endpoint)

    base = LlamaFlags(n_ctx=n_ctx, n_parallel=req.n_parallel, n_ubatch=n_ubatch, cache_type_k=cache,
                      cache_type_v=cache, flash_attn=req.flash_attn, rpc=rpc,
                      devices=tuple(inventory.names) if inventory.devices else None, ignored=("-fit", "off"))
    devices = resolve_devices(base, inventory)
    costs = _costs(ctx, cache)
    return _Setting(ctx, costs, base, devices, inventory, budgets, req, output_on_host and bool(devices))


@dataclass(frozen=True)
class _Variant:
    """Choices made outside the solver: KV cache type, -ub, and where the output matrix lives."""

    cache: str
    n_ubatch: int
    output_on_host: bool


@dataclass(frozen=True)
class _Candidate:
    variant: _Variant
    setting: _Setting
    assignment: Assignment
    flags: LlamaFlags
    estimate: Estimate
    rounds: int
    prediction: Prediction

    def score(self) -> tuple[float, float, int]:
        """Decode speed first (1 % steps, so noise does not decide), then prefill, then a larger -ub."""
        p = self.prediction
        return (round(math.log(max(p.decode_tokens_s, 1e-9)) / math.log(1.01)), p.prefill_tokens_s,
                self.variant.n_ubatch)


def _variants(req: PlanRequest, cache: str, has_devices: bool) -> list[_Variant]:
    ubatches = (req.n_ubatch,) if req.n_ubatch else UBATCH_CANDIDATES
    outputs = (False, True) if req.allow_output_on_host and has_devices else (False,)
    return [_Variant(cache, ub, out) for ub in ubatches for out in outputs]


def _candidate(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest, n_ctx: int,
               v: _Variant, exact: bool = False) -> _Candidate | None:
    s = _setting(ctx, inventory, budgets, req, n_ctx, v.cache, v.n_ubatch, v.output_on_host)
    found = _solve_verified(s, exact)
    if found is None:
        return None
    a, flags, est, rounds = found
    return _Candidate(v, s, a, flags, est, rounds, _predict(s, a, est))


def _largest_context(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest, v: _Variant,
                     limit: int, floor: int = 0, exact: bool = False) -> _Candidate | None:
    """The candidate with the largest context (a multiple of 256·n_parallel, at most `limit`) above `floor`."""
    step = CTX_PAD * max(1, req.n_parallel)
    lo, hi = floor // step, max(limit // step, 1)
    best = _candidate(ctx, inventory, budgets, req, lo * step, v, exact) if lo else None
    if lo and best is None:
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        found = _candidate(ctx, inventory, budgets, req, mid * step, v, exact)
        if found is not None:
            lo, best = mid, found
        else:
            hi = mid - 1
    return best


def _all_on_devices(c: _Candidate) -> bool:
    """Every layer and every expert on a device, the output matrix included."""
    return (c.flags.n_gpu_layers == c.setting.ctx.facts.n_layer_all + 1 and not c.assignment.experts_on_host
            and not c.variant.output_on_host)


def _best(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest, cache: str) -> _Candidate | None:
    limit = req.n_ctx or ctx.facts.n_ctx_train
    best: _Candidate | None = None
    last_score: dict[bool, tuple] = {}
    for v in _variants(req, cache, bool(inventory.devices)):
        if best is not None and _all_on_devices(best) and v.n_ubatch < best.variant.n_ubatch:
            break  # a smaller -ub only helps when something is still on the host
        if last_score.get(v.output_on_host, ()) == ("stop",):
            continue
        if req.max_ctx or req.objective is Objective.CONTEXT:
            floor = best.flags.n_ctx if best else 0
            found = _largest_context(ctx, inventory, budgets, req, v, limit, floor)
            better = found is not None and (best is None or (found.flags.n_ctx, found.score())
                                            > (best.flags.n_ctx, best.score()))
        else:
            found = _candidate(ctx, inventory, budgets, req, limit, v)
            better = found is not None and (best is None or found.score() > best.score())
            # Halving -ub frees compute buffer for layers; once it stops paying, smaller ones will not.
            previous = last_score.get(v.output_on_host)
            score = found.score()[:1] if found is not None else None
            if previous is not None and score is not None and score <= previous:
                last_score[v.output_on_host] = ("stop",)
            elif score is not None:
                last_score[v.output_on_host] = score
        if better:
            best = found
    return best


def _one_more_layer(best: _Candidate) -> _Candidate:
    """The solver sizes each device's compute buffer by a probe (every layer offloaded), which can
    leave a device just short of one more layer. As llama.cpp's fit does last, move the host's last
    layer onto the device range that follows it (its routed experts too, else kept on the host)
    while the estimate finds it within budget and the prediction is no slower."""
    s = best.setting
    while s.devices and best.assignment.counts(len(s.devices) + 1)[0]:
        a = best.assignment
        il = a.counts(len(s.devices) + 1)[0] - 1
        if il == s.ctx.facts.n_layer_all and s.output_on_host:
            break  # the output layer would bring only its norm: its matrix stays on the host
        slot = next((x for x in a.slot_of_layer if x), 1)
        slots = a.slot_of_layer[:il] + (slot,) + a.slot_of_layer[il + 1:]
        moe = s.request.allow_expert_offload and _layer_weights(s.ctx)[1][il] > 0
        for on_host in [a.experts_on_host] + ([a.experts_on_host | {il}] if moe else []):
            trial = replace(a, slot_of_layer=slots, experts_on_host=frozenset(on_host))
            flags = flags_for(s, trial)
            est = estimate(s.ctx, flags, s.inventory, exact_compute=False)
            cand = replace(best, assignment=trial, flags=flags, estimate=est, prediction=_predict(s, trial, est))
            if not overuse(s, est) and cand.score()[0] >= best.score()[0]:
                break
        else:
            break
        exact = estimate(s.ctx, flags, s.inventory)  # the trial used the analytic model: judge exactly
        if overuse(s, exact):
            break
        best = replace(cand, estimate=exact)
    return best


# What of a layer's routed experts may stay in host memory while the rest returns to its device, most
# returned first: llama.cpp's own fit splits a layer's experts this way (common/fit.cpp, the
# LAYER_FRACTION_GATE / _UP overflow patterns) to use the room a whole layer's experts would not fit.
_PARTIAL_EXPERTS_ON_HOST = ("down", "(gate|down)")


def _return_expert_tensors(best: _Candidate) -> _Candidate:
    """The solver moves a layer's routed experts as one unit. A device left with less room than a
    unit may still hold one or two of its expert tensors: per device, return them from one of its
    offloaded layers, each try checked by the estimate. The throughput prediction keeps counting
    that layer's experts as on the host (a conservative figure)."""
    s, a = best.setting, best.assignment
    on_device = {il: dev for dev, layers in best.estimate.layers for il in layers if dev != CPU}
    partial: dict[int, str] = {}
    flags, est = best.flags, best.estimate
    for dev in [d.name for d in s.devices]:
        mine = sorted(il for il in a.experts_on_host if on_device.get(il) == dev)
        for keep in _PARTIAL_EXPERTS_ON_HOST if mine else ():
            trial = {**partial, mine[-1]: keep}
            rest = flags_for(s, replace(a, experts_on_host=a.experts_on_host - frozenset(trial)))
            extra = tuple(OverrideArg("ot", rf"blk\.{il}\.ffn_{k}_(ch|)exps=CPU") for il, k in sorted(trial.items()))
            t_flags = replace(rest, override_args=rest.override_args + extra)
            t_est = estimate(s.ctx, t_flags, s.inventory, exact_compute=False)
            if not overuse(s, t_est):
                partial, flags, est = trial, t_flags, t_est
                break
    if not partial:
        return best
    est = estimate(s.ctx, flags, s.inventory)  # the trials used the analytic model: judge exactly once
    return best if overuse(s, est) else replace(best, flags=flags, estimate=est)


def plan(model, inventory: Inventory, request: PlanRequest = PlanRequest(), max_vram: str | None = None,
         ram: str | None = None, budgets: Budgets | None = None, with_explain: bool = False) -> PlanResult:
    """The best placement of `model` on `inventory`; raises InfeasiblePlacement when nothing fits."""
    ctx = model_context(model)
    _COSTS.clear()
    budgets = budgets or resolve_budgets(inventory, max_vram, ram)
    if not ctx.facts.n_ctx_train and not request.n_ctx:
        raise BadInput(f"{ctx.model.path}: the model declares no training context; give --ctx")
    for cache in request.cache_types:
        best = _judged(ctx, inventory, budgets, request, _best(ctx, inventory, budgets, request, cache))
        if best is None:
            continue
        best = _return_expert_tensors(_one_more_layer(best))
        result = PlanResult(ctx.model.path, header_sha256(ctx.model.path, ctx.model.header_bytes), inventory,
                            budgets, request, best.flags, best.estimate, best.prediction,
                            best.assignment.experts_on_host, best.rounds)
        if not with_explain:
            return result
        from planner.explain import explain  # the explanation re-estimates neighbours of the plan

        return replace(result, explain=explain(ctx, result))
    raise _infeasible(ctx, inventory, budgets, request)


def _judged(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest,
            best: _Candidate | None) -> _Candidate | None:
    """The chosen candidate checked with the exact estimate (corrected and solved again if it is over
    a budget there); at the largest context, the context is searched again if it no longer fits."""
    if best is None:
        return None
    exact = _candidate(ctx, inventory, budgets, req, best.flags.n_ctx, best.variant, exact=True)
    if exact is None and (req.max_ctx or req.objective is Objective.CONTEXT):
        exact = _largest_context(ctx, inventory, budgets, req, best.variant, best.flags.n_ctx, exact=True)
    return exact


def predict_estimate(ctx: ModelContext, costs: CostTable, est: Estimate, inventory: Inventory,
                     experts_on_host: frozenset[int] = frozenset(), output_on_host: bool = False) -> Prediction:
    """The throughput model's prediction for the placement an estimate describes."""
    n = ctx.facts.n_layer_all
    layer_device = ["CPU"] * n
    for dev, layers in est.layers:
        for il in layers:
            if il < n:
                layer_device[il] = dev
    view = PlacementView(tuple(layer_device), est.output_device, experts_on_host, est.cparams.n_ctx_seq,
                         est.cparams.n_ubatch, est.cparams.n_seq, output_on_host)
    return predict(ctx.facts, costs, view, inventory)


def _predict(s: _Setting, a: Assignment, est: Estimate) -> Prediction:
    return predict_estimate(s.ctx, s.costs, est, s.inventory, a.experts_on_host, s.output_on_host)


def _infeasible(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest) -> InfeasiblePlacement:
    """What would not fit, and the nearest thing that would."""
    cache = req.cache_types[0]
    n_ctx = req.n_ctx or ctx.facts.n_ctx_train
    s = _setting(ctx, inventory, budgets, req, n_ctx, cache)
    all_host = estimate(ctx, replace(s.flags, n_gpu_layers=0), inventory)
    over = overuse(s, all_host)
    shortfalls = tuple(Shortfall(name, n + budgets.host_bytes if name == HOST else n + budgets.devices[name],
                                 budgets.host_bytes if name == HOST else budgets.devices[name])
                       for name, n in over.items())
    hints = []
    ub = req.n_ubatch or UBATCH_CANDIDATES[-1]
    smaller = _largest_context(ctx, inventory, budgets, req, _Variant(cache, ub, bool(inventory.devices)), n_ctx)
    if smaller is not None:
        hints.append(f"--ctx {smaller.flags.n_ctx} fits")
    if cache == "f16":
        q8 = _largest_context(ctx, inventory, budgets, req, _Variant("q8_0", ub, bool(inventory.devices)), n_ctx)
        if q8 is not None:
            hints.append(f"--cache-type q8_0 fits up to --ctx {q8.flags.n_ctx}")
    parts = [f"{sf.device} short by {sf.missing_bytes / 2**20:.0f} MiB" for sf in shortfalls]
    msg = (f"no placement of {ctx.model.path} at context {n_ctx} fits the budgets"
           + (f" ({'; '.join(parts)})" if parts else ""))
    return InfeasiblePlacement(msg, shortfalls, "; ".join(hints) or "more memory, or a smaller model")
