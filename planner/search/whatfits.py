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
# a quicker test: None when it finds nothing, else what its placement uses on each row (Host included)
Quick = Callable[[Budgets], dict[str, int] | None]


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


def least_budget(quick: Quick, checks: tuple[Fits, ...], budgets: Budgets, name: str, ceiling: int,
                 deadline: float) -> LeastBudget | None:
    """Bisect `name`'s budget in whole MiB between the user's (which does not fit) and the user's plus
    `ceiling` with `quick`, then settle the boundary with each of `checks` in turn, each slower and
    nearer the planner than the last; the last is the planner's own verdict, so the answer plans and
    one MiB less does not. None when even the ceiling does not fit (this budget alone does not bind).

    A placement `quick` finds under a budget uses some of it; no more than that use is needed, so the
    upper end drops to it at once (most of the bisection, for the host: a plan fills the devices first)."""
    now = budget_of(budgets, name)

    def use_at(n_mib: int) -> int | None:
        use = quick(with_budget(budgets, name, n_mib * MiB))
        return None if use is None else -(-use.get(name, 0) // MiB)

    floor, hi = now // MiB, -(-(now + ceiling) // MiB)
    first = use_at(hi)
    if first is None:
        return None
    lo, top, hi = floor, hi, max(floor + 1, min(hi, first))   # top: passed by `quick`; no check climbs higher
    guess = hi   # what `quick`'s placement at the top uses: where a check out of time looks first
    while hi - lo > 1 and time.monotonic() < deadline:
        mid = (lo + hi) // 2
        use = use_at(mid)
        lo, hi = (lo, max(lo + 1, min(mid, use))) if use is not None else (mid, hi)
    for check in checks:
        def passes(n_mib: int, check: Fits = check) -> bool:
            return check(with_budget(budgets, name, n_mib * MiB))

        settled = _settle(passes, lo, hi, top, floor, deadline, guess)
        if settled is None:
            return None
        lo, hi = settled
    return LeastBudget(name, hi * MiB, now, exact=hi - lo == 1)


def _settle(passes: Callable[[int], bool], lo: int, hi: int, top: int, floor: int,
            deadline: float, guess: int) -> tuple[int, int] | None:
    """A check's own boundary near the last one's (`lo` failed it, `hi` passed it): gallop away from
    the side this check disagrees on, then bisect. Returns (lo, hi): `hi` passes this check, `lo`
    fails it, one MiB apart unless time ran out; None when nothing up to `top` passes. `floor` (the
    user's budget) is known not to fit. The time limit only makes an answer coarser: a climb it stops
    asks `guess` (when above) and then `top`, so a row is dropped for failing, never for being slow."""
    step = 1
    while not passes(hi):                     # the boundary is above: climb
        if hi >= top:
            return None
        if time.monotonic() > deadline:       # out of time: a row which binds is reported (inexact)
            for last in (guess, top):
                if last > hi and passes(last):
                    return hi, last
            return None
        lo, hi, step = hi, min(hi + step, top), step * 2
    step = 1
    while lo > floor and passes(lo):          # the boundary is below: descend
        hi, lo, step = lo, max(lo - step, floor), step * 2
        if time.monotonic() > deadline:
            return lo, hi
    while hi - lo > 1 and time.monotonic() < deadline:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if passes(mid) else (mid, hi)
    return lo, hi


def least_budgets(quick: Quick, checks: tuple[Fits, ...], budgets: Budgets, ceiling: int, start: float,
                  seconds: float | None = None) -> list[LeastBudget]:
    """Every budget row that alone can make a plan exist, with its least budget; host first. The
    search stops at `start` + `seconds` (default SEARCH_SECONDS, read when called). Each row gets an
    equal share of the time left when its turn comes, so a slow row (a loaded machine, a large
    model's host search) cannot leave the rows after it unsearched; a row that finishes early leaves
    its rest to the next."""
    deadline = start + (SEARCH_SECONDS if seconds is None else seconds)
    names = [HOST, *budgets.devices]
    found = []
    for i, name in enumerate(names):
        now = time.monotonic()
        share = max(0.0, deadline - now) / (len(names) - i)
        least = least_budget(quick, checks, budgets, name, ceiling, now + share)
        if least is not None:
            found.append(least)
    return found
