"""validate with companions: the embedded engine runs the target; a drafter's estimated rows are held
back from the budgets it runs under, and the report names them."""
from __future__ import annotations

from planner.checking.validate import validate
from planner.checking.validation_report import ValidateRequest
from planner.llama.flags import parse_llama_flags
from planner.memory.estimate import estimate
from planner.registry.examples import resolve_model


def test_drafter_rows_are_held_back_from_the_budgets():
    path = resolve_model("example:gemma3-270m")
    flags = parse_llama_flags(["-c", "4096", "-md", path, "--spec-type", "draft-simple"])
    budgets = {"Host": 4 << 30}
    drafter = estimate(path, flags).companions[0]
    held = sum(d.total_bytes for d in drafter.devices)
    report = validate(ValidateRequest(path, flags, None, budgets), reserve_only=True)
    host = next(d for d in report.devices if d.name == "Host")
    assert host.budget_bytes == budgets["Host"] - held
    assert any("held back" in n and "draft" in n for n in report.notes)
