"""What would fit when nothing does: per budget, the least that plans; the largest context that plans.

Every figure is found by planning, never by subtraction: a shortfall read off one extreme placement
(every layer on the host, or every layer on the devices) says nothing about the placements between
them, which is where a plan usually is. A budget is bisected to the MiB with the user's other
settings, each probe a whole planner run, so the reported budget plans and one MiB less does not.
The search has a time limit; a search it stops reports its verified upper bound, marked inexact.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.core.units import MiB
from planner.hardware.budgets import Budgets
from planner.llama.placement import HOST

# seconds the whole search may add to an infeasible answer (issue 18: "at most 2 s"); the rest of
# the answer (the first, failed plan) is outside it
SEARCH_SECONDS = 1.8

Fits = Callable[[Budgets], bool]


@dataclass(frozen=True)
class LeastBudget:
    """The least budget of `device` (bytes, whole MiB) at which a plan exists, the others as given."""

    device: str
    need_bytes: int
    budget_bytes: int
    exact: bool          # False: the time limit stopped the bisection; need_bytes plans, less may too


def budget_of(budgets: Budgets, name: str) -> int:
    return budgets.host_bytes if name == HOST else budgets.devices[name]


def with_budget(budgets: Budgets, name: str, n_bytes: int) -> Budgets:
    """`budgets` with one row's budget set; the host's shared pool (UMA) moves with the host."""
    if name != HOST:
        return replace(budgets, devices={**budgets.devices, name: n_bytes})
    pool = budgets.uma_pool_bytes
    grown = None if pool is None else pool + n_bytes - budgets.host_bytes
    return replace(budgets, host_bytes=n_bytes, uma_pool_bytes=grown)


def least_budget(quick: Fits, fits: Fits, budgets: Budgets, name: str, ceiling: int,
                 deadline: float) -> LeastBudget | None:
    """Bisect `name`'s budget in whole MiB between the user's (which does not fit) and the user's plus
    `ceiling` with `quick` (a cheaper test that agrees with the planner nearly always), then settle
    the boundary with `fits` (the planner's own verdict): the answer plans and one MiB less does not.
    None when even the ceiling does not fit (this budget alone does not bind)."""
    now = budget_of(budgets, name)

    def test(test_fits: Fits, n_mib: int) -> bool:
        return test_fits(with_budget(budgets, name, n_mib * MiB))

    lo, hi = now // MiB, -(-(now + ceiling) // MiB)
    if not test(quick, hi):
        return None
    top = hi                                   # passed by `quick`: the settling climbs no higher
    while hi - lo > 1 and time.monotonic() < deadline:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if test(quick, mid) else (mid, hi)
    if hi - lo > 1:
        return LeastBudget(name, hi * MiB, now, exact=False) if test(fits, hi) else None
    return _settle(lambda n: test(fits, n), lo, hi, top, name, now, deadline)


def _settle(fits_mib: Callable[[int], bool], lo: int, hi: int, top: int, name: str, now: int,
            deadline: float) -> LeastBudget | None:
    """The planner's own boundary near `quick`'s (`lo` failed, `hi` passed): gallop away from the
    side it disagrees on, then bisect with it; None when it passes nothing up to `top`."""
    step = 1
    while not fits_mib(hi):                   # the boundary is above: climb
        if hi >= top or time.monotonic() > deadline:
            return None
        lo, hi, step = hi, min(hi + step, top), step * 2
    while fits_mib(lo):                       # the boundary is below: descend
        hi, lo, step = lo, max(lo - step, now // MiB - 1), step * 2
        if time.monotonic() > deadline or lo < now // MiB:
            return LeastBudget(name, hi * MiB, now, exact=False)
    while hi - lo > 1:
        if time.monotonic() > deadline:
            return LeastBudget(name, hi * MiB, now, exact=False)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits_mib(mid) else (mid, hi)
    return LeastBudget(name, hi * MiB, now, exact=True)


def least_budgets(quick: Fits, fits: Fits, budgets: Budgets, ceiling: int, start: float,
                  seconds: float = SEARCH_SECONDS) -> list[LeastBudget]:
    """Every budget row that alone can make a plan exist, with its least budget; host first."""
    deadline = start + seconds
    found = []
    for name in [HOST, *budgets.devices]:
        if time.monotonic() > deadline:
            break
        least = least_budget(quick, fits, budgets, name, ceiling, deadline)
        if least is not None:
            found.append(least)
    return found
