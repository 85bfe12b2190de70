"""fitplan: placement planner for ggml engines.

The public Python API (planner/api/calls.py; every call returns a frozen dataclass with `to_dict()`)::

    import planner
    planner.inspect("example:gemma3-270m")                              # -> InspectResult
    planner.estimate("example:gemma3-270m", "-c 8192", ["CUDA0=8GiB"])  # -> Estimate
    planner.sweep("example:gemma3-270m", {"ctx": "4096..32768"}, ["CUDA0=8GiB"])  # -> SweepResult
    planner.plan("example:gemma3-270m", ["CUDA0=1GiB"], ram="16GiB", n_ctx=32768)  # -> PlanResult
    planner.validate("example:gemma3-270m", "-c 512", ["CUDA0=2GiB"], ram="8GiB")  # -> ValidateReport
    planner.choose("hf://ORG/REPO", ["CUDA0=24GiB"], ram="64GiB", n_ctx=32768)     # -> Choice
    planner.plan_set("configs/sets/home-box.yaml", ["CUDA0=1GiB"], ram="8GiB")  # -> SetReport
    planner.plots.plot_plan(planner.plan(...), "plan.png")              # a picture (matplotlib)

`import planner` stays cheap: the names above are looked up on first use (PEP 562 module
`__getattr__`), so nothing heavier than this file loads until a call is made.

Inside, one sub-package per pipeline stage; imports run downward only (DESIGN.md, checked by
import-linter): cli -> api -> sweeps, sd, checking -> planning -> memory -> runtime.engine ->
llama -> model, hardware -> gguf -> runtime.ggml -> core.
"""
from __future__ import annotations

import importlib
from typing import Any

# public name -> (module, attribute); None as the attribute means the module itself
_LAZY: dict[str, tuple[str, str | None]] = {
    **{name: ("planner.api", name) for name in ("inspect", "estimate", "plan", "sweep", "validate", "choose",
                                                     "plan_set")},
    "plots": ("planner.sweeps.plots", None),
    "InspectResult": ("planner.model.inspect", "InspectResult"),
    "Estimate": ("planner.memory.estimate", "Estimate"),
    "SweepResult": ("planner.sweeps.sweep", "SweepResult"),
    "PlanRequest": ("planner.search.result", "PlanRequest"),
    "PlanResult": ("planner.search.result", "PlanResult"),
    "ValidateReport": ("planner.checking.validation_report", "ValidateReport"),
    "Choice": ("planner.sweeps.choose", "Choice"),
    "SetReport": ("planner.emit.set_document", "SetReport"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    found = importlib.import_module(module)
    return found if attribute is None else getattr(found, attribute)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
