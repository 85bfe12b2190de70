"""fitplan: placement planner for ggml engines.

The public Python API (planner/api.py; every call returns a frozen dataclass with `to_dict()`)::

    import planner
    planner.inspect("example:gemma3-270m")                              # -> InspectResult
    planner.estimate("example:gemma3-270m", "-c 8192", ["CUDA0=8GiB"])  # -> Estimate
    planner.sweep("example:gemma3-270m", {"ctx": "4096..32768"}, ["CUDA0=8GiB"])  # -> SweepResult
    planner.plan("example:gemma3-270m", ["CUDA0=1GiB"], ram="16GiB", n_ctx=32768)  # -> PlanResult
    planner.validate("example:gemma3-270m", "-c 512", ["CUDA0=2GiB"], ram="8GiB")  # -> ValidateReport

`import planner` stays cheap: nothing below is imported until first used. The API's names
are also the names of the modules that implement them (planner/inspect.py, ...), and Python
sets a package attribute to a submodule whenever that submodule is imported. So instead of
functions that an import would silently replace, those submodules are made callable: calling
`planner.estimate(...)` calls `planner.api.estimate`, while `planner.estimate.model_context`
and `import planner.estimate` keep working as before.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any

API_NAMES = ("inspect", "estimate", "plan", "sweep", "validate")


class _ApiModule(types.ModuleType):
    """A submodule that, called, runs the public API function of the same name."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from planner import api

        return getattr(api, self.__name__.rpartition(".")[2])(*args, **kwargs)


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        # the import system binds each imported submodule here: make the API ones callable
        if name in API_NAMES and type(value) is types.ModuleType:
            value.__class__ = _ApiModule
        super().__setattr__(name, value)


def __getattr__(name: str) -> Any:
    if name in API_NAMES:
        return importlib.import_module(f"planner.{name}")  # binds it through _Package.__setattr__
    raise AttributeError(f"module 'planner' has no attribute {name!r}")


sys.modules[__name__].__class__ = _Package
