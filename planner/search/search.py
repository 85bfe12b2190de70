"""`fitplan plan`: the best llama.cpp placement for a model on an inventory under budgets.

Pipeline: the model read once → per-layer demands → `solve.solve_dp` → llama.cpp flags →
`estimate` on exactly those flags, corrected until within budget (planner/search/problem.py). This
module searches what the solver does not decide — KV cache type, -ub, the output matrix on the
host, the context — ranks the candidates, judges the best with the exact estimate, and refines it
the way llama.cpp's own fit finishes (one more layer, single expert tensors back).
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Any

from planner.core.errors import BadInput, DrafterOutputUnreachable, InfeasiblePlacement, Shortfall, Suggestion
from planner.core.units import MiB, fmt_bytes, fmt_mib
from planner.hardware.budgets import (
    DEFAULT_DEVICE_MARGIN,
    HOST_RESERVE_FRACTION,
    HOST_RESERVE_MIN,
    Budgets,
    resolve_budgets,
)
from planner.hardware.inventory import Inventory
from planner.llama.commands import PLANNED_PROGRAM
from planner.llama.context import ModelContext, ModelLike, model_context
from planner.llama.flags import LlamaFlags, OverrideArg, OverrideKind
from planner.llama.placement import CPU, HOST, HOST_ROWS
from planner.llama.settings import CTX_PAD
from planner.memory.estimate import Estimate, estimate
from planner.search import whatfits
from planner.search.companion_plan import arrangements, rank, resolved_companions, swing_lines
from planner.search.contexts import above_train_warning, max_context, train_ceiling
from planner.search.explain import explain
from planner.search.problem import (
    Setting,
    flags_for,
    layer_weights,
    make_setting,
    overuse,
    row_totals,
    solve_verified,
)
from planner.search.result import Companions, PlanRequest, PlanResult
from planner.search.solve import Assignment, Objective
from planner.search.tensor_plan import TensorOption, comparison_lines, prefer_tensor, tensor_option
from planner.search.whatfits import LeastBudget, least_budgets
from planner.speed.throughput import Prediction, offloading, predict_estimate

log = logging.getLogger(__name__)


# -ub values tried when the user leaves it open: llama.cpp's default first, then halves down to
# ggml's op-offload batch threshold (below it, prompt matmuls on host weights stop offloading).
UBATCH_CANDIDATES = (512, 256, 128, 64, 32)


# ---------------------------------------------------------------------------------------------
# demands: what each layer and each slot costs, from the estimate's own building blocks


@dataclass(frozen=True)
class _Variant:
    """Choices made outside the solver: KV cache type, -ub, and where the output matrix lives."""

    cache: str
    n_ubatch: int
    output_on_host: bool
    op_offload: bool = True    # False: --no-op-offload (host weights stay on the CPU, nothing staged)


@dataclass(frozen=True)
class _Candidate:
    variant: _Variant
    setting: Setting
    assignment: Assignment
    flags: LlamaFlags
    estimate: Estimate
    rounds: int
    prediction: Prediction

    def score(self) -> tuple[float, int, float, int]:
        """Decode speed first (1 % steps, so model noise does not decide), then more weight bytes on
        the devices, then prefill, then a larger -ub."""
        p = self.prediction
        on_devices = sum(d.model_bytes for d in self.estimate.devices if d.name not in HOST_ROWS)
        return (round(math.log(max(p.decode_tokens_s, 1e-9)) / math.log(1.01)), on_devices, p.prefill_tokens_s,
                self.variant.n_ubatch)


def _variants(req: PlanRequest, cache: str, inventory: Inventory) -> list[_Variant]:
    """-ub x output on the host x op offload. Where a device offloads ops, each placement is tried
    both ways: offloaded host weights prefill on the device but are staged in its compute buffer;
    `--no-op-offload` stages nothing and prefills them on the CPU."""
    has_devices = bool(inventory.devices)
    ubatches = (req.n_ubatch,) if req.n_ubatch else UBATCH_CANDIDATES
    outputs = (False, True) if req.allow_output_on_host and has_devices else (False,)
    if req.op_offload is not None:
        offloads: tuple[bool, ...] = (req.op_offload,)
    else:
        offloads = (True, False) if offloading(inventory) else (True,)
    return [_Variant(cache, ub, out, oo) for ub in ubatches for out in outputs for oo in offloads]


def _candidate(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest, n_ctx: int,
               v: _Variant, exact: bool = False) -> _Candidate | None:
    try:
        s = make_setting(ctx, inventory, budgets, req, n_ctx, v.cache, v.n_ubatch, v.output_on_host, v.op_offload)
        found = solve_verified(s, exact)
    except DrafterOutputUnreachable:   # llama.cpp would abort on this drafter placement: not a plan
        return None
    if found is None:
        return None
    return _Candidate(v, s, found.assignment, found.flags, found.estimate, found.rounds,
                      _predict(s, found.assignment, found.estimate))


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


def _ranked(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest,
            cache: str) -> list[_Candidate]:
    """Every variant's candidate (under the analytic compute model), best first."""
    limit = max_context(ctx, req)
    by_context = req.max_ctx or req.objective is Objective.CONTEXT
    found_all: list[_Candidate] = []
    last_score: dict[tuple[bool, bool], tuple[Any, ...]] = {}
    for v in _variants(req, cache, inventory):
        best = max(found_all, key=lambda c: _rank(c, by_context), default=None)
        if best is not None and _all_on_devices(best) and v.n_ubatch < best.variant.n_ubatch:
            break  # a smaller -ub only helps when something is still on the host
        lane = (v.output_on_host, v.op_offload)
        if last_score.get(lane, ()) == ("stop",):
            continue
        if by_context:
            found = _largest_context(ctx, inventory, budgets, req, v, limit, best.flags.n_ctx if best else 0)
        else:
            found = _candidate(ctx, inventory, budgets, req, limit, v)
            # Halving -ub frees compute buffer for layers; once it stops paying, smaller ones will not.
            previous = last_score.get(lane)
            score = found.score()[:2] if found is not None else None
            if previous is not None and score is not None and score <= previous:
                last_score[lane] = ("stop",)
            elif score is not None:
                last_score[lane] = score
        if found is not None:
            found_all.append(found)
    return sorted(found_all, key=lambda c: _rank(c, by_context), reverse=True)


def _rank(c: _Candidate, by_context: bool) -> tuple[Any, ...]:
    return (c.flags.n_ctx, c.score()) if by_context else c.score()


def _one_more_layer(best: _Candidate) -> _Candidate:
    """The solver sizes each device's compute buffer by a probe (every layer offloaded), which can
    leave a device just short of one more layer. As llama.cpp's fit does last, move the host's last
    layer onto the device range that follows it (its routed experts too, else kept on the host)
    while the estimate finds it within budget and the prediction is no slower."""
    s = best.setting
    experts = layer_weights(s.ctx, s.flags).experts
    while s.devices and best.assignment.counts(len(s.devices) + 1)[0]:
        a = best.assignment
        il = a.counts(len(s.devices) + 1)[0] - 1
        if il == s.ctx.facts.n_layer_all and s.output_on_host:
            break  # the output layer would bring only its norm: its matrix stays on the host
        slot = next((x for x in a.slot_of_layer if x), 1)
        slots = a.slot_of_layer[:il] + (slot,) + a.slot_of_layer[il + 1:]
        moe = s.request.allow_expert_offload and experts[il] > 0
        for on_host in [a.experts_on_host] + ([a.experts_on_host | {il}] if moe else []):
            trial = replace(a, slot_of_layer=slots, experts_on_host=frozenset(on_host))
            flags = flags_for(s, trial)
            est = estimate(s.ctx, flags, s.inventory, exact_compute=False, program=PLANNED_PROGRAM)
            cand = replace(best, assignment=trial, flags=flags, estimate=est, prediction=_predict(s, trial, est))
            if not overuse(s, est) and cand.score()[0] >= best.score()[0]:
                break
        else:
            break
        # the trial used the analytic model: judge exactly
        exact = estimate(s.ctx, flags, s.inventory, program=PLANNED_PROGRAM)
        if overuse(s, exact):
            break
        # and predict from it: only the simulated reserve counts the op nodes each device runs
        best = replace(cand, estimate=exact, prediction=_predict(s, trial, exact))
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
            extra = tuple(OverrideArg(OverrideKind.OT, rf"blk\.{il}\.ffn_{k}_(ch|)exps=CPU")
                          for il, k in sorted(trial.items()))
            t_flags = replace(rest, override_args=rest.override_args + extra)
            t_est = estimate(s.ctx, t_flags, s.inventory, exact_compute=False, program=PLANNED_PROGRAM)
            if not overuse(s, t_est):
                partial, flags, est = trial, t_flags, t_est
                break
    if not partial:
        return best
    # the trials used the analytic model: judge exactly once
    est = estimate(s.ctx, flags, s.inventory, program=PLANNED_PROGRAM)
    return best if overuse(s, est) else replace(best, flags=flags, estimate=est)


def plan(model: ModelLike, inventory: Inventory,
         request: PlanRequest | None = None, max_vram: str | None = None, ram: str | None = None,
         budgets: Budgets | None = None, with_explain: bool = False, what_would_fit: bool = False,
         warn: bool = True) -> PlanResult:
    """The best placement of `model` on `inventory` (`request`: PlanRequest's defaults when None);
    raises InfeasiblePlacement when nothing fits, with what would (`what_would_fit`: the least budgets
    and the largest context that plan, searched for up to SEARCH_SECONDS; else only the verdict).
    `warn`: log the plan's warnings (a context past the training context); False for a caller that plans
    many times on the way to one answer and warns once itself (the verdict, a sweep)."""
    request = request or PlanRequest()
    if not request.cache_types:   # _infeasible and make_setting start from the first one
        raise BadInput("cache types: none given; expected at least one KV cache type, e.g. f16 or f16,q8_0")
    ctx = model_context(model)
    budgets = budgets or resolve_budgets(inventory, max_vram, ram)
    if not ctx.facts.n_ctx_train and not request.n_ctx:
        raise BadInput(f"{ctx.model.path}: the model declares no training context; give --ctx")
    started = time.monotonic()
    best, request, alone = _first_fit(ctx, inventory, budgets, request, with_explain)
    if best is None and not what_would_fit:
        raise InfeasiblePlacement(f"no placement of {ctx.model.path} at {_at(ctx, request)} fits the budgets")
    if best is None:
        raise _infeasible(ctx, inventory, budgets, request, time.monotonic() - started)
    best = _return_expert_tensors(_one_more_layer(best))
    warning = above_train_warning(ctx, best.flags) if warn else None
    if warning:
        log.warning("%s", warning)
    result, tensor = _layer_or_tensor(ctx, inventory, budgets, request, best)
    if not with_explain:
        return result
    lines = explain(ctx, result)
    if tensor is not None:
        lines += tuple(comparison_lines(best.prediction, tensor, result.flags.split_mode == "tensor"))
    if request.companions.any:
        lines += tuple(swing_lines(best.estimate, alone.estimate if alone else None))
    return replace(result, explain=lines)


def _first_fit(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest, with_explain: bool
               ) -> tuple[_Candidate | None, PlanRequest, _Candidate | None]:
    """plan()'s verdict before its refinements, the request with the companions' placement chosen,
    and (for --explain's swing, with companions) the target planned alone."""
    if not req.companions.any:
        return _fits(ctx, inventory, budgets, req), req, None
    req = replace(req, companions=resolved_companions(req.companions, ctx, inventory))
    best, req = _best_arrangement(ctx, inventory, budgets, req)
    alone = _fits(ctx, inventory, budgets, replace(req, companions=Companions())) if with_explain else None
    return best, req, alone


def _layer_or_tensor(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest,
                     best: _Candidate) -> tuple[PlanResult, TensorOption | None]:
    """The plan: the layer split, or -sm tensor on the same devices where that decodes faster
    (planner/search/tensor_plan.py); and the tensor option weighed, for --explain."""
    weigh = len(inventory.devices) > 1 and not req.companions.any and req.split_mode != "layer"
    tensor = tensor_option(ctx, inventory, budgets, best.flags) if weigh else None
    if tensor is not None and tensor.estimate is not None and tensor.prediction is not None \
            and prefer_tensor(best.prediction, tensor):
        return PlanResult(ctx.model.path, ctx.model.header_sha256, inventory, budgets, req, tensor.flags,
                          tensor.estimate, tensor.prediction, frozenset(), best.rounds), tensor
    return PlanResult(ctx.model.path, ctx.model.header_sha256, inventory, budgets, req, best.flags, best.estimate,
                      best.prediction, best.assignment.experts_on_host, best.rounds), tensor


def _best_arrangement(ctx: ModelContext, inventory: Inventory, budgets: Budgets,
                      req: PlanRequest) -> tuple[_Candidate | None, PlanRequest]:
    """Each placement of the companions planned (planner/search/companion_plan.py), the one with the
    shortest speculative step kept, the drafter beside the target's last layers on a tie; with none
    that holds, the first arrangement's request (for the verdict of what would fit)."""
    found: list[tuple[Any, _Candidate, PlanRequest]] = []
    tries = arrangements(req.companions, inventory)
    for c in tries:
        r = replace(req, companions=c)
        cand = _fits(ctx, inventory, budgets, r)
        if cand is not None:
            ranked = rank(cand.estimate, cand.prediction.decode_tokens_s, r, inventory)
            found.append(((round(ranked.step_s, 9), not ranked.on_last), cand, r))
    if not found:
        return None, replace(req, companions=tries[0])
    _, best, r = min(found, key=lambda f: f[0])
    return best, r


def _fits(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest) -> _Candidate | None:
    """plan()'s own verdict before its refinements: the judged best candidate of the first cache type
    that has one, or None when nothing fits."""
    for cache in req.cache_types:
        best = _judged(ctx, inventory, budgets, req, _ranked(ctx, inventory, budgets, req, cache))
        if best is not None:
            return best
    return None


def _judged(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest,
            ranked: list[_Candidate], tries: int = 3) -> _Candidate | None:
    """The best candidate that holds under the exact estimate (each corrected and solved again if it
    is over a budget there), trying the next ones when it does not; at the largest context, the
    context of the best variant is searched again."""
    if offloading(inventory):
        # The analytic filter does not see weights staged by op offload: judge the best variant
        # both ways exactly (with and without --no-op-offload) and keep the better that fits.
        by_context = req.max_ctx or req.objective is Objective.CONTEXT
        seen: set[_Variant] = set()
        for c in ranked:
            if c.variant in seen or len(seen) >= 2 * tries:
                continue
            twin = replace(c.variant, op_offload=not c.variant.op_offload)
            seen |= {c.variant, twin}
            pair = [v for v in (c.variant, twin) if any(r.variant == v for r in ranked)]
            judged = [e for v in pair if (e := _candidate(ctx, inventory, budgets, req, c.flags.n_ctx, v, exact=True))]
            if judged:
                return max(judged, key=lambda e: _rank(e, by_context))
    else:
        for c in ranked[:tries]:
            exact = _candidate(ctx, inventory, budgets, req, c.flags.n_ctx, c.variant, exact=True)
            if exact is not None:
                return exact
    if ranked and (req.max_ctx or req.objective is Objective.CONTEXT):
        top = ranked[0]
        return _largest_context(ctx, inventory, budgets, req, top.variant, top.flags.n_ctx, exact=True)
    return None


def _predict(s: Setting, a: Assignment, est: Estimate) -> Prediction:
    return predict_estimate(s.ctx, s.costs, est, s.inventory, a.experts_on_host, s.output_on_host)


def _infeasible(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest,
                first_s: float) -> InfeasiblePlacement:
    """What would not fit, and what would, each figure found by planning (planner/search/whatfits.py):
    per budget the least that plans with the other settings as given, and the largest context that
    plans as the budgets are. The search's time limit scales with nothing: it is SEARCH_SECONDS."""
    started = time.monotonic()
    # a plain request for the budget search: at --ctx max, a plan at the smallest context
    plain = replace(req, n_ctx=CTX_PAD * max(1, req.n_parallel), max_ctx=False) if req.max_ctx else req
    n_ctx = max_context(ctx, plain)
    ceiling = _everything(ctx, inventory, plain, n_ctx)
    checks = (lambda b: _fits_quickly(ctx, inventory, b, plain, exact=True) is not None,
              lambda b: _fits(ctx, inventory, b, plain) is not None)
    least = least_budgets(lambda b: _fits_quickly(ctx, inventory, b, plain), checks, budgets, ceiling, started)
    shortfalls = tuple(Shortfall(lb.device, lb.need_bytes, lb.budget_bytes) for lb in least)
    hints = [_budget_hint(lb) for lb in least]
    if not req.max_ctx:
        hints += _context_hints(ctx, inventory, budgets, req, n_ctx, started + whatfits.SEARCH_SECONDS)
    log.info("what would fit: first plan %.2f s, search %.2f s", first_s, time.monotonic() - started)
    at_least = f" at context {n_ctx}" if req.max_ctx else ""   # --ctx max: the smallest context
    parts = [f"{sf.device} needs a budget of {fmt_mib(sf.need_bytes)} MiB{at_least}, has {fmt_mib(sf.budget_bytes)} MiB"
             for sf in shortfalls]
    msg = (f"no placement of {ctx.model.path} at {_at(ctx, req)} fits the budgets"
           + (f" ({'; '.join(parts)})" if parts else " (no single budget is enough)"))
    if not hints:
        hints.append(Suggestion("more memory on more than one device, or a smaller model"))
    return InfeasiblePlacement(msg, shortfalls, suggestions=tuple(hints))


def _fits_quickly(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest,
                  exact: bool = False) -> dict[str, int] | None:
    """The what-would-fit search's quick test: only the smallest -ub (it needs the least of every
    budget), stopping at the first variant that holds under the analytic compute model (`exact`: and
    then under the exact estimate); what that placement uses per row, or None. The search settles its
    answer with `_fits`, so where they disagree the planner's verdict is the one reported."""
    smallest = replace(req, n_ubatch=req.n_ubatch or UBATCH_CANDIDATES[-1])
    n_ctx = max_context(ctx, req)
    for cache in req.cache_types:
        for v in _variants(smallest, cache, inventory):
            found = _candidate(ctx, inventory, budgets, req, n_ctx, v)
            if found is not None and exact:
                found = _candidate(ctx, inventory, budgets, req, n_ctx, v, exact=True)
            if found is not None:
                return row_totals(found.estimate)
    return None


def _at(ctx: ModelContext, req: PlanRequest) -> str:
    return "any context" if req.max_ctx else f"context {max_context(ctx, req)}"


def _everything(ctx: ModelContext, inventory: Inventory, req: PlanRequest, n_ctx: int) -> int:
    """Bytes that certainly hold the model on one budget: every row of both extreme placements."""
    s = make_setting(ctx, inventory, Budgets({}, 0), req, n_ctx, req.cache_types[0])
    extremes = [replace(s.flags, n_gpu_layers=0), replace(s.flags, n_gpu_layers=ctx.facts.n_layer_all + 1)]
    return sum(d.total_bytes for f in extremes
               for d in estimate(ctx, f, inventory, exact_compute=False, program=PLANNED_PROGRAM).devices)


def _budget_hint(lb: LeastBudget) -> Suggestion:
    """The least budget as the options that give it: --max-ram/--max-vram, and the free memory it takes
    with the default reserve (budgets.py: the host keeps max(2 GiB, 10 %), a device 512 MiB)."""
    size = f"{math.ceil(lb.need_bytes / MiB)}MiB"
    if lb.device == HOST:
        free = max(lb.need_bytes + HOST_RESERVE_MIN, math.ceil(lb.need_bytes / (1 - HOST_RESERVE_FRACTION)))
        option = f"--max-ram {size}, or {fmt_bytes(free)} of available RAM with the default reserve"
    else:
        option = (f"--max-vram {lb.device}={size}, or {fmt_bytes(lb.need_bytes + DEFAULT_DEVICE_MARGIN)} free "
                  "with the default margin")
    least = "fits" if lb.exact else "fits (the search stopped at its time limit: less may fit too)"
    return Suggestion(f"{lb.device} at {size} {least} ({option})", device=lb.device, budget_bytes=lb.need_bytes,
                      exact=lb.exact)


def _context_hints(ctx: ModelContext, inventory: Inventory, budgets: Budgets, req: PlanRequest, n_ctx: int,
                   deadline: float) -> list[Suggestion]:
    """The largest context that plans as the budgets are (each cache type asked for, then q8_0), at
    most the training context unless allowed; each re-planned at that context before it is shown."""
    limit = n_ctx if req.allow_ctx_above_train else min(n_ctx, train_ceiling(ctx, req) or n_ctx)
    hints: list[Suggestion] = []
    for caches in (req.cache_types, ("q8_0",) if "q8_0" not in req.cache_types else ()):
        if not caches or time.monotonic() > deadline:
            continue
        smallest = replace(req, n_ctx=CTX_PAD * max(1, req.n_parallel), max_ctx=False, cache_types=caches)
        if _fits_quickly(ctx, inventory, budgets, smallest) is None:
            continue   # not even the smallest context: no context search can find one
        widest = _fits(ctx, inventory, budgets, replace(req, n_ctx=limit, max_ctx=True, cache_types=caches))
        if widest is None or (widest.flags.n_ctx >= n_ctx and caches == req.cache_types):
            continue
        found = widest.flags.n_ctx
        if _fits(ctx, inventory, budgets, replace(req, n_ctx=found, max_ctx=False, cache_types=caches)) is None:
            continue   # not confirmed by a plain plan at that context: not shown
        cache = widest.flags.cache_type_k
        text = (f"--ctx {found} fits" if caches == req.cache_types else
                f"--cache-type {cache} fits up to --ctx {found}")
        hints.append(Suggestion(text, n_ctx=found, cache_type=cache))
    return hints
