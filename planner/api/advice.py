"""`plan --verdict` and `choose` for the command line: one call on the devices a command resolved (the
requests come from planner.api.plans), and the choice's page. Apart from `plan`'s module, so a plan
loads neither.
"""
from __future__ import annotations

from collections.abc import Sequence

from planner.api.machine import DevicesReport
from planner.search.result import PlanRequest
from planner.search.verdict import Verdict
from planner.search.verdict import verdict as run_verdict
from planner.sweeps.choose import Choice
from planner.sweeps.choose import choose as run_choose
from planner.sweeps.choose_html import choice_html

__all__ = ["Choice", "Verdict", "choice_html", "choose_on", "verdict_on"]


def verdict_on(model: str, found: DevicesReport, request: PlanRequest, clients: int) -> Verdict:
    """`plan --verdict`: the arrangements ranked for `clients` streams (planner/search/verdict.py)."""
    return run_verdict(model, found.inventory, found.budgets, request, clients)


def choose_on(models: Sequence[str], found: DevicesReport, request: PlanRequest, include: Sequence[str],
              max_files: int) -> Choice:
    """`choose`: every candidate file planned on the devices a command resolved, ranked."""
    return run_choose(list(models), found.inventory, found.budgets, request, tuple(include), max_files)
