"""The placement solver: which slot holds each layer, which layers keep their experts in host memory.

Only plans llama.cpp can express (seed 003 §1, the expressibility law): layers sit in contiguous
ranges in llama.cpp's device order — the first layers on the host (what `-ngl` leaves behind),
then each device's range (integer `-ts` counts) — and `-ot` moves tensors to the CPU only. The
output layer is the last "layer" of that order, as llama.cpp's split arithmetic counts it.

Two solvers share one `Problem`:

* `solve_dp` — exact dynamic programming over (slot, first layer): a slot's cost depends only on
  its own contiguous range, so the best placement of layers i..L on slots s..S is
  min_j cost(s, i, j) + best(s+1, j). Within a range, the experts that must leave a device go in
  equal-sized units (MoE expert tensors are the same size in every MoE layer); the host budget,
  which couples the slots through offloaded experts, is met with a Lagrange price on host bytes.
  O(S·L²) with numpy over j: milliseconds for 128 layers on 8 devices.
* `solve_milp` — the same model as a MILP in PuLP (CBC, bundled; HiGHS when `highspy` is
  installed), exact for unequal expert sizes and the coupled host budget, but slow on large
  symmetric instances (20 s where the DP takes milliseconds). `fitplan plan --solver milp` uses it
  instead of the DP; the tests use it to check the DP's optimum.

`solve` runs the one a `Solver` names. PuLP stays inside this module.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from planner.core.choices import Objective, Solver

if TYPE_CHECKING:
    from pulp import LpAffineExpression, LpProblem, LpSolver, LpVariable

log = logging.getLogger(__name__)

INF = float("inf")


@dataclass(frozen=True)
class Slot:
    """A place layers can go, in llama.cpp order. Slot 0 is always the host (CPU)."""

    name: str
    budget: int            # bytes this slot may hold (the host's: after its fixed bytes)
    bandwidth: float       # bytes/s its weights and KV are read at
    fixed_bytes: int       # charged when the slot holds any layer (its compute buffer)
    boundary_s: float      # cost of one split boundary into or out of this slot
    pooled: bool = False   # a UMA device: its bytes come out of the host's budget too (seed 003 §7)


@dataclass(frozen=True)
class LayerDemand:
    """What one layer puts on its slot. The last entry of a problem is the output layer."""

    device_bytes: int         # weights and KV on the layer's slot
    expert_bytes: int         # routed experts that `-ot …exps=CPU` can move to host memory
    read_bytes: float         # decode bytes per token read on the layer's slot, experts excluded
    expert_read_bytes: float  # decode bytes per token of the experts one token touches


@dataclass(frozen=True)
class Problem:
    layers: tuple[LayerDemand, ...]
    slots: tuple[Slot, ...]
    allow_expert_offload: bool = True


@dataclass(frozen=True)
class Assignment:
    slot_of_layer: tuple[int, ...]      # slot index per layer (output layer last)
    experts_on_host: frozenset[int]     # layer indices
    seconds_per_token: float            # predicted decode time under the problem's figures

    def counts(self, n_slots: int) -> tuple[int, ...]:
        return tuple(self.slot_of_layer.count(s) for s in range(n_slots))


class _Arrays:
    """Prefix sums of the layer table, so a range's totals are two lookups."""

    def __init__(self, problem: Problem) -> None:
        layers = problem.layers
        self.n = len(layers)
        w = np.array([d.device_bytes for d in layers], dtype=np.float64)
        e = np.array([d.expert_bytes if problem.allow_expert_offload else 0 for d in layers], dtype=np.float64)
        r = np.array([d.read_bytes + d.expert_read_bytes for d in layers], dtype=np.float64)
        er = np.array([d.expert_read_bytes for d in layers], dtype=np.float64)
        self.pw, self.pr = _prefix(w), _prefix(r)
        self.pm = _prefix((e > 0).astype(np.float64))
        movable = e[e > 0]
        # One unit of expert offload: the smallest expert layer (a conservative unit when sizes differ).
        self.e_unit = float(movable.min()) if movable.size else 0.0
        self.e_max = float(movable.max()) if movable.size else 0.0
        self.er_unit = float(er[e > 0].mean()) if movable.size else 0.0
        self.e = e


def _prefix(a: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(a)])


def _range_costs(arr: _Arrays, slot: Slot, host: Slot, price: float, budget_scale: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Cost of the slot taking layers [i, j) for every i <= j (an (n+1) x (n+1) matrix, INF where
    j < i or the range cannot fit), and the expert units each range sends to the host."""
    wr = arr.pw[None, :] - arr.pw[:, None]
    rr = arr.pr[None, :] - arr.pr[:, None]
    mr = arr.pm[None, :] - arr.pm[:, None]
    need = wr + slot.fixed_bytes - slot.budget * budget_scale
    k = np.ceil(np.maximum(need, 0.0) / arr.e_unit) if arr.e_unit > 0 else np.where(need > 0, np.inf, 0.0)
    feasible = ((need <= 0) | (k <= mr)) & (wr >= 0) & np.triu(np.ones_like(wr, dtype=bool))
    k = np.where(feasible, k, 0.0)  # no inf·0 below; infeasible ranges are priced at INF anyway
    per_unit = arr.er_unit * (1.0 / host.bandwidth - 1.0 / slot.bandwidth) + 2 * max(slot.boundary_s, host.boundary_s)
    # host bytes are priced: a pooled slot's whole range is host memory (experts sent to the host stay
    # in the pool), another slot's only the experts it sends there
    pool_price = price * (wr + slot.fixed_bytes) if slot.pooled else k * price * arr.e_max
    cost = np.where(feasible, rr / slot.bandwidth + k * per_unit + pool_price + slot.boundary_s, INF)
    diag = np.arange(arr.n + 1)
    cost[diag, diag], k[diag, diag] = 0.0, 0.0  # an empty range: the slot is unused
    return cost, k


@dataclass(frozen=True)
class _Range:
    """The layers [start, end) one slot holds, and the expert units it sends to the host."""

    slot: int
    start: int
    end: int
    expert_units: int


@dataclass(frozen=True)
class _Solution:
    """The DP's answer: its decode time (host bytes unpriced) and one range per slot, the host's first."""

    seconds_per_token: float
    ranges: tuple[_Range, ...]

    @property
    def host_prefix(self) -> int:
        return self.ranges[0].end

    @property
    def expert_units(self) -> int:
        return sum(r.expert_units for r in self.ranges)


def _dp(problem: Problem, arr: _Arrays, price: float, budget_scale: float, host_prefix: int | None = None
        ) -> _Solution | None:
    """The best ranges for the device slots given the host takes a prefix (`host_prefix` fixes its length)."""
    slots, n = problem.slots, arr.n
    host = slots[0]
    n_s = len(slots)
    best = np.full((n_s + 1, n + 1), INF)
    choice = np.zeros((n_s + 1, n + 1), dtype=np.int64)
    units = np.zeros((n_s + 1, n + 1), dtype=np.int64)
    best[n_s, n] = 0.0
    rows = np.arange(n + 1)
    for s in range(n_s - 1, 0, -1):
        cost, k = _range_costs(arr, slots[s], host, price, budget_scale)
        total = cost + best[s + 1][None, :]
        # on a tie the earlier slot takes more: llama.cpp's first device is its main device
        j = n - np.argmin(total[:, ::-1], axis=1)
        best[s], choice[s], units[s] = total[rows, j], j, k[rows, j].astype(np.int64)
    # The host takes [0, a): its bytes are priced, its budget checked by the caller.
    host_cost = (arr.pr / host.bandwidth) + price * arr.pw
    total = host_cost + best[1]
    if host_prefix is not None:
        total = np.where(np.arange(n + 1) == host_prefix, total, INF)
    a = int(np.argmin(total))
    if not math.isfinite(total[a]):
        return None
    ranges, i = [_Range(0, 0, a, 0)], a
    for s in range(1, n_s):
        j = int(choice[s, i])
        ranges.append(_Range(s, i, j, int(units[s, i])))
        i = j
    return _Solution(float(total[a] - price * _host_bytes(problem, arr, ranges)), tuple(ranges))


def _host_bytes(problem: Problem, arr: _Arrays, ranges: Sequence[_Range]) -> float:
    """Bytes in host memory: the host's own layers, the experts other slots send there, and the
    whole of every pooled (UMA) slot in use — what the host slot's budget caps."""
    total = arr.pw[ranges[0].end]
    for r in ranges[1:]:
        slot = problem.slots[r.slot]
        if slot.pooled:
            total += arr.pw[r.end] - arr.pw[r.start] + (slot.fixed_bytes if r.end > r.start else 0)
        else:
            total += r.expert_units * arr.e_max
    return float(total)


def _assignment(arr: _Arrays, found: _Solution) -> Assignment:
    slot_of = [0] * arr.n
    on_host: set[int] = set()
    for r in found.ranges:
        for il in range(r.start, r.end):
            slot_of[il] = r.slot
        if r.expert_units and r.slot > 0:
            # the largest experts in the range leave first
            movable = sorted((il for il in range(r.start, r.end) if arr.e[il] > 0), key=lambda il: (-arr.e[il], il))
            on_host.update(movable[:r.expert_units])
    return Assignment(tuple(slot_of), frozenset(on_host), found.seconds_per_token)


def solve_dp(problem: Problem, objective: Objective = Objective.THROUGHPUT) -> Assignment | None:
    """The best assignment by dynamic programming, or None when nothing fits."""
    arr = _Arrays(problem)
    host_budget = problem.slots[0].budget
    found = _dp(problem, arr, 0.0, 1.0)
    if found is not None and _host_bytes(problem, arr, found.ranges) > host_budget:
        found = _priced(problem, arr, 1.0, host_budget)
    if found is None:
        return None
    if objective is Objective.BALANCE:
        found = _balanced(problem, arr, found, host_budget) or found
    return _assignment(arr, found)


def _balanced(problem: Problem, arr: _Arrays, fastest: _Solution, host_budget: float) -> _Solution | None:
    """Keep what the fastest plan leaves on the host (its layers and expert count); find the smallest
    U such that every device fits in U times its budget (bisection), and the fastest plan there."""
    host_prefix, units = fastest.host_prefix, fastest.expert_units

    def fits(scale: float) -> _Solution | None:
        found = _dp(problem, arr, 0.0, scale, host_prefix)
        ok = (found is not None and _host_bytes(problem, arr, found.ranges) <= host_budget
              and found.expert_units <= units)
        return found if ok else None

    lo, hi, best = 0.0, 1.0, fits(1.0)
    for _ in range(16):
        mid = (lo + hi) / 2
        found = fits(mid)
        if found is not None:
            hi, best = mid, found
        else:
            lo = mid
    return best


def _priced(problem: Problem, arr: _Arrays, scale: float, host_budget: float) -> _Solution | None:
    """Raise a price on host bytes until the host budget holds (bisection on the price)."""
    lo, hi = 0.0, 1e-12
    while True:
        found = _dp(problem, arr, hi, scale)
        if found is None:
            return None
        if _host_bytes(problem, arr, found.ranges) <= host_budget:
            break
        hi *= 10
        if hi > 1e6:
            return None
    best = found
    for _ in range(30):
        mid = (lo + hi) / 2
        candidate = _dp(problem, arr, mid, scale)
        if candidate is not None and _host_bytes(problem, arr, candidate.ranges) <= host_budget:
            hi, best = mid, candidate
        else:
            lo = mid
    return best


# ---------------------------------------------------------------------------------------------
# the MILP: `pulp` is passed in by solve_milp, the one place that imports it


@dataclass(frozen=True)
class _MilpVars:
    """The MILP's decisions. x[s][il] = 1: layer il sits on slot s (a difference of staircase
    variables); used[s] = 1: slot s holds a layer; q[s, il] = 1: layer il sits on device slot s
    with its routed experts in host memory."""

    x: list[list[LpAffineExpression]]
    used: list[LpVariable]
    q: dict[tuple[int, int], LpVariable]


def _staircase(pulp: ModuleType, lp: LpProblem, n_s: int, n_l: int) -> list[list[LpAffineExpression]]:
    """x[s][il] from y[s][il] = 1: layer il sits on a slot at or before s. Rows and columns are
    monotone (a staircase), so each slot holds one contiguous range in slot order."""
    y = [[pulp.LpVariable(f"y_{s}_{il}", cat="Binary") for il in range(n_l)] for s in range(n_s)]
    for il in range(n_l):
        lp += y[n_s - 1][il] == 1
    for s in range(n_s):
        for il in range(n_l - 1):
            lp += y[s][il] >= y[s][il + 1]
        if s + 1 < n_s:
            for il in range(n_l):
                lp += y[s][il] <= y[s + 1][il]
    return [[y[s][il] - (y[s - 1][il] if s else 0) for il in range(n_l)] for s in range(n_s)]


def _milp_variables(pulp: ModuleType, lp: LpProblem, problem: Problem) -> _MilpVars:
    layers = problem.layers
    n_l, n_s = len(layers), len(problem.slots)
    x = _staircase(pulp, lp, n_s, n_l)
    used = [pulp.LpVariable(f"used_{s}", cat="Binary") for s in range(n_s)]
    for s in range(n_s):
        for il in range(n_l):
            lp += used[s] >= x[s][il]
    q = {(s, il): pulp.LpVariable(f"q_{s}_{il}", cat="Binary")
         for s in range(1, n_s) for il in range(n_l) if layers[il].expert_bytes and problem.allow_expert_offload}
    for (s, il), var in q.items():
        lp += var <= x[s][il]
    return _MilpVars(x, used, q)


def _milp_budgets(pulp: ModuleType, lp: LpProblem, problem: Problem, v: _MilpVars) -> None:
    """Each slot's bytes within its budget; offloaded experts leave their device for the host; the
    host and the pooled (UMA) slots together within the host's budget."""
    layers, slots = problem.layers, problem.slots
    pool = []
    for s in range(len(slots)):
        mem = (pulp.lpSum(layers[il].device_bytes * v.x[s][il] for il in range(len(layers)))
               + slots[s].fixed_bytes * v.used[s]
               - pulp.lpSum(layers[il].expert_bytes * var for (slot, il), var in v.q.items() if slot == s))
        if s == 0:
            mem += pulp.lpSum(layers[il].expert_bytes * var for (_, il), var in v.q.items())
        lp += mem <= slots[s].budget
        if s == 0 or slots[s].pooled:
            pool.append(mem)
    if len(pool) > 1:
        lp += pulp.lpSum(pool) <= slots[0].budget


def _milp_seconds(pulp: ModuleType, problem: Problem, v: _MilpVars) -> LpAffineExpression:
    """Decode seconds per token: each layer's reads at its slot's bandwidth, offloaded experts at the
    host's with two boundaries each, and one boundary per device slot in use."""
    layers, slots = problem.layers, problem.slots
    host = slots[0]
    return (pulp.lpSum((d.read_bytes + d.expert_read_bytes) / slots[s].bandwidth * v.x[s][il]
                       for il, d in enumerate(layers) for s in range(len(slots)))
            + pulp.lpSum((layers[il].expert_read_bytes * (1 / host.bandwidth - 1 / slots[s].bandwidth)
                          + 2 * max(slots[s].boundary_s, host.boundary_s)) * var for (s, il), var in v.q.items())
            + pulp.lpSum(slots[s].boundary_s * v.used[s] for s in range(1, len(slots))))


def _milp_solver(pulp: ModuleType, time_limit_s: float | None) -> LpSolver:
    """HiGHS when `highspy` is installed, else the CBC PuLP bundles."""
    if "HiGHS" in pulp.listSolvers(onlyAvailable=True):
        return pulp.getSolver("HiGHS", msg=False, timeLimit=time_limit_s)
    return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s)


def _milp_assignment(pulp: ModuleType, lp: LpProblem, problem: Problem, v: _MilpVars) -> Assignment:
    n_s, n_l = len(problem.slots), len(problem.layers)
    slot_of = tuple(next(s for s in range(n_s) if (pulp.value(v.x[s][il]) or 0) > 0.5) for il in range(n_l))
    on_host = frozenset(il for (_s, il), var in v.q.items() if (var.value() or 0) > 0.5)
    return Assignment(slot_of, on_host, float(pulp.value(lp.objective)))


def solve_milp(problem: Problem, objective: Objective = Objective.THROUGHPUT,
               time_limit_s: float | None = None) -> Assignment | None:
    """The same model as an exact MILP (staircase formulation); None when nothing fits."""
    import pulp  # kept local: PuLP (~0.05 s to load) is only needed when the MILP runs

    lp = pulp.LpProblem("placement", pulp.LpMinimize)
    v = _milp_variables(pulp, lp, problem)
    _milp_budgets(pulp, lp, problem, v)
    lp += _milp_seconds(pulp, problem, v)
    if objective is Objective.BALANCE:
        log.info("solve_milp: the balance objective is solved by the DP; the MILP minimises time")
    status = lp.solve(_milp_solver(pulp, time_limit_s))
    if pulp.LpStatus[status] != "Optimal" or lp.objective is None:
        return None
    return _milp_assignment(pulp, lp, problem, v)


SOLVERS: dict[Solver, Callable[[Problem, Objective], Assignment | None]] = {
    Solver.DP: solve_dp,
    Solver.MILP: solve_milp,
}


def solve(problem: Problem, objective: Objective = Objective.THROUGHPUT, solver: Solver = Solver.DP
          ) -> Assignment | None:
    """The assignment `solver` finds; None when nothing fits."""
    return SOLVERS[Solver(solver)](problem, objective)
