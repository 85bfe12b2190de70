"""What the HTML plan report shows, as plain data: per-device memory against budgets, the layer map
(which device holds each layer, which tensors an override moved), predicted speeds, the commands,
the why-list and the what-would-fit figures. Built from a PlanResult, or from a plan document read
back (`fitplan report PLAN.yaml`: its flags estimated again, as `validate` does, so the page shows
what llama.cpp would allocate for exactly those flags)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from planner.core.errors import BadInput, InfeasiblePlacement
from planner.core.render import layer_ranges
from planner.emit.document import Deployment
from planner.hardware.budgets import Budgets, over_verdict, pool_name
from planner.llama.commands import PLANNED_PROGRAM
from planner.llama.context import ModelContext, model_context
from planner.llama.placement import CPU, CPU_REPACK, HOST
from planner.memory.estimate import estimate
from planner.search.contexts import max_context
from planner.search.explain import explain
from planner.search.problem import costs_for, row_totals
from planner.search.result import PlanRequest, PlanResult, bench_command, plan_rows, server_command
from planner.search.search import plan
from planner.speed.throughput import LAYER_OF, experts_on_host_of, predict_estimate
from planner.system.llama_tools import LLAMA_CPP_PIN


@dataclass(frozen=True)
class Bar:
    """One budget row: its three parts and its budget (None: a row without one, CPU_REPACK)."""

    name: str
    model_bytes: int
    context_bytes: int
    compute_bytes: int
    budget_bytes: int | None
    note: str                    # what the row holds ("layers 0-17,output"), or what its figure is
    overhead_bytes: int = 0      # held outside llama.cpp's breakdown (planner/llama/overhead.py)

    @property
    def total_bytes(self) -> int:
        """What the row holds against its budget: the breakdown's three parts and the overhead."""
        return self.model_bytes + self.context_bytes + self.compute_bytes + self.overhead_bytes


@dataclass(frozen=True)
class LayerCell:
    index: int | None            # None: the output layer
    device: str
    moved: tuple[tuple[str, str], ...]   # (tensor, device) an override put elsewhere


@dataclass(frozen=True)
class Report:
    title: str
    facts: tuple[tuple[str, str], ...]       # (label, value) lines under the title
    bars: tuple[Bar, ...]
    layers: tuple[LayerCell, ...]
    moved_elsewhere: tuple[tuple[str, str], ...]   # moved tensors of no layer (token_embd, output)
    speeds: tuple[tuple[str, str], ...]
    commands: tuple[tuple[str, str], ...]    # (label, one shell line)
    why: tuple[str, ...]
    what_fits: tuple[str, ...]
    infeasible: bool = False


def plan_report(result: PlanResult, ctx: ModelContext | None = None) -> Report:
    """The report of a plan (its why-list computed when the plan has none)."""
    if not result.explain:
        result = replace(result, explain=explain(ctx or model_context(result.model_path), result))
    est, p = result.estimate, result.prediction
    bars = tuple(Bar(r["name"], r["model_bytes"], r["context_bytes"], r["compute_bytes"], r["budget_bytes"],
                     "layers " + _ranges(r["layers"], r["output_layer"]), r["overhead_bytes"])
                 for r in plan_rows(result))
    speeds: tuple[tuple[str, str], ...] = (
        ("decode", f"{p.decode_tokens_s:.1f} tokens/s"), ("prefill", f"{p.prefill_tokens_s:.0f} tokens/s"),
        ("device boundaries per token", str(p.n_boundaries)))
    if p.assumed_rates:
        speeds += (("note", "some device rates unknown: assumed figures used"),)
    commands = [("run it (llama-server)", server_command(result))]
    bench = bench_command(result)
    commands.append(("measure it (llama-bench)", bench or "# llama-bench cannot express this placement"))
    facts: tuple[tuple[str, str], ...] = (
        ("model", result.model_path), ("context", f"{result.n_ctx} tokens, {result.flags.n_parallel} slot(s)"),
        ("KV cache", result.flags.cache_type_k), ("objective", result.request.objective.value),
        ("compute buffers", est.compute_model), ("llama.cpp", LLAMA_CPP_PIN))
    over = over_verdict(result.budgets, row_totals(est))
    if over is not None:   # a plan document whose budgets were changed after planning
        facts = (("verdict", over),) + facts
    next_steps = tuple(line for line in result.explain if line.startswith(("context ", "layer ")) and "+" in line)
    headroom = tuple(f"{b.name}: {_mib(b.budget_bytes - b.total_bytes)} MiB left of {_mib(b.budget_bytes)} MiB"
                     for b in bars if b.budget_bytes is not None) + _pool_headroom(result)
    widest = _widest_context(ctx or model_context(result.model_path), result)
    return Report(f"fitplan plan: {result.model_path.rsplit('/', 1)[-1]}", facts, bars,
                  _layer_cells(result), _moved_elsewhere(result), speeds, tuple(commands), result.explain,
                  headroom + next_steps + widest)


def _pool_headroom(result: PlanResult) -> tuple[str, ...]:
    """What the pool Host and the UMA devices share has left (nothing without one)."""
    pool = result.budgets.uma_pool_bytes
    if pool is None:
        return ()
    used = result.budgets.pooled(row_totals(result.estimate))
    return (f"the pool {pool_name(result.budgets)} share: {_mib(pool - used)} MiB left of "
            f"{_mib(pool)} MiB",)


def _widest_context(ctx: ModelContext, result: PlanResult) -> tuple[str, ...]:
    """The largest context these budgets hold with the plan's other settings, found by planning it
    (--ctx max, so at most the training context); nothing when the plan is already there."""
    request = replace(result.request, n_ctx=None, max_ctx=True)
    if result.n_ctx >= max_context(ctx, request):
        return ()
    try:
        widest = plan(ctx, result.inventory, request, budgets=result.budgets, warn=False)
    except InfeasiblePlacement:
        return ()
    if widest.n_ctx <= result.n_ctx:
        return ()
    return (f"context up to {widest.n_ctx} fits these budgets (--ctx {widest.n_ctx}: decode "
            f"{widest.prediction.decode_tokens_s:.1f} tokens/s there, {result.prediction.decode_tokens_s:.1f} at "
            f"{result.n_ctx})",)


def infeasible_report(model_path: str, budgets: Budgets, error: InfeasiblePlacement) -> Report:
    """The page for a plan that does not fit: each budget against the least that plans, and the hints."""
    need = {sf.device: sf.need_bytes for sf in error.shortfalls}
    rows = [(HOST, budgets.host_bytes)] + list(budgets.devices.items())
    bars = tuple(Bar(name, need.get(name, 0), 0, 0, budget, "least budget that plans" if name in need else "")
                 for name, budget in rows)
    return Report(f"fitplan plan: {model_path.rsplit('/', 1)[-1]} does not fit", (("model", model_path),
                  ("verdict", str(error)), ("llama.cpp", LLAMA_CPP_PIN)), bars, (), (), (), (), (),
                  tuple(s.text for s in error.suggestions) or (error.suggestion,), infeasible=True)


def result_from_deployment(dep: Deployment) -> PlanResult:
    """A plan document as a PlanResult: its flags estimated on its inventory, its budgets as written."""
    inventory = dep.inventory
    if inventory is None:
        raise BadInput(f"{dep.model_path}: the plan file names no inventory to report against")
    ctx = model_context(dep.model_path)
    est = estimate(ctx, dep.flags, inventory, program=PLANNED_PROGRAM)
    experts = experts_on_host_of(est)
    prediction = predict_estimate(ctx, costs_for(ctx, dep.flags.cache_type_k), est, inventory, experts,
                                  est.output_on_host)
    budgets = dep.limits
    request = PlanRequest(n_ctx=dep.flags.n_ctx, n_parallel=dep.flags.n_parallel,
                          cache_types=(dep.flags.cache_type_k,), n_ubatch=dep.flags.n_ubatch)
    result = PlanResult(dep.model_path, dep.header_sha256 or ctx.model.header_sha256, inventory, budgets, request,
                        dep.flags, est, prediction, experts, 0)
    return replace(result, explain=explain(ctx, result))


def _layer_cells(result: PlanResult) -> tuple[LayerCell, ...]:
    est = result.estimate
    owner = {il: dev for dev, layers in est.layers for il in layers}
    moved: dict[int | None, list[tuple[str, str]]] = {}
    for name, dev in est.moved:
        m = LAYER_OF.match(name)
        if m:
            moved.setdefault(int(m.group(1)), []).append((name, _row(dev)))
    cells = [LayerCell(il, _row(owner.get(il, CPU)), tuple(moved.get(il, ()))) for il in range(est.n_layer_all)]
    cells.append(LayerCell(None, _row(owner.get(est.n_layer_all, CPU)), ()))
    return tuple(cells)


def _moved_elsewhere(result: PlanResult) -> tuple[tuple[str, str], ...]:
    return tuple((name, _row(dev)) for name, dev in result.estimate.moved if not LAYER_OF.match(name))


def _row(device: str) -> str:
    """A placement device as its breakdown row (CPU weights are Host's)."""
    return HOST if device in (CPU, CPU_REPACK) else device


def _ranges(layers: list[int], output: bool) -> str:
    return layer_ranges(layers, output=output) or "-"


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"
