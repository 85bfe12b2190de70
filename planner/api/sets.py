"""`plan-set` for the command line: the set planned on the devices a command resolved, and what is made
of it (the set document, the router preset, the llama-swap config, the pages).
"""
from __future__ import annotations

from planner.api.machine import DevicesReport
from planner.emit.set_document import SetReport, is_set_plan, read_set_plan, set_document
from planner.emit.set_exports import llama_swap_config, preset_ini
from planner.emit.set_report_html import infeasible_set_html, set_html
from planner.search.set_input import ModelSet, read_model_set
from planner.search.set_plan import SetPlan
from planner.search.set_plan import plan_set as run_plan_set
from planner.search.set_suggest import SetInfeasible

__all__ = [
    "ModelSet", "SetInfeasible", "SetPlan", "SetReport", "infeasible_set_html", "is_set_plan", "llama_swap_config",
    "plan_set_on", "preset_ini", "read_model_set", "read_set_plan", "set_document", "set_html",
]


def plan_set_on(spec: ModelSet, found: DevicesReport) -> SetPlan:
    """`plan-set`: the set planned on the devices a command resolved."""
    return run_plan_set(spec, found.inventory, found.budgets)
