"""fitplan's library entry: the calls every command makes, and the types, errors, units and
renderers they need. The command line (planner/cli) imports nothing else of the planner (an
import-linter contract in pyproject.toml); a notebook uses the same names.

  planner.api.calls      one call per command with the inputs a notebook has at hand (estimate, plan, ...)
  planner.api.machine    the inventory options resolved to devices and budgets; `devices`; network settings
  planner.api.plans      plan: the request from the options, the call, the documents and pages
  planner.api.advice     plan --verdict and choose
  planner.api.sets       plan-set: the call, the set document, the router preset and llama-swap config
  planner.api.runs       estimate with budgets, sweep, validate, serve, calibrate; the plots
  planner.api.outputs    export, fetch-header
  planner.api.diffusion  sd-fit

What loads numpy, gguf or the runtime (calls, plans, advice, sets, runs, outputs, diffusion) is looked up on
first use (PEP 562 module `__getattr__`): the command line and `fitplan --help` import this module
and load none of it until a command runs.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from planner.api.machine import (
    AUTO,
    DevicesReport,
    InventoryChoice,
    InventoryOptions,
    devices_report,
    network_settings,
    rpc_endpoints,
)
from planner.core.choices import Engine, Objective, OpOffload, OptionEnum, Program, Solver, SplitMode, SweepMode
from planner.core.errors import BadInput, FitplanError, FlagError, InfeasiblePlacement, InventoryError, UsageError
from planner.core.render import render
from planner.hardware.catalog import CATALOG_KINDS, list_catalog
from planner.hardware.inventory import one_of
from planner.sd.modes import Feature, last_flash_attn, legacy_modes
from planner.sd.roles import DEFAULT_STEPS, FileRole, ModelSource
from planner.system import net
from planner.system.files import check_output_path, write_atomic
from planner.system.llama_tools import LLAMA_CPP_PIN, LOOPBACK, ToolsError, ensure_tools, tools_dir

# ruff: noqa: F401  (the names below are this module's exports: __all__ lists them through _SUBMODULES)
if TYPE_CHECKING:   # the lazy names, for type checkers (the table below says where each lives)
    from planner.api.advice import Choice, Verdict, choice_html, choose_on, verdict_on
    from planner.api.calls import as_flags, as_inventory, choose, estimate, inspect, plan, plan_set, sweep, validate
    from planner.api.diffusion import SdFitRequest, SdPlan, sd_fit
    from planner.api.outputs import HeaderFile, export_plan, fetch_header, llama_server_program
    from planner.api.plans import (
        LLAMA_SERVER,
        OP_OFFLOAD,
        Companions,
        PlanRequest,
        PlanResult,
        choose_request,
        deployment,
        deployment_yaml,
        infeasible_page,
        llama_argv,
        parse_cache_type,
        parse_cache_types,
        parse_ctx,
        plan_argv,
        plan_on,
        plan_page,
        plan_request,
        read_deployment,
        report_page,
        server_command,
    )
    from planner.api.runs import (
        BudgetedEstimate,
        CalibrateRequest,
        CalibrateResult,
        InstanceCheck,
        MemoryCheck,
        PreparedServe,
        ServeRequest,
        ServeResult,
        SweepResult,
        ValidateReport,
        Workload,
        calibrate,
        check_table,
        estimate_on,
        plot_plan,
        plot_sweep,
        prepare_router,
        prepare_serve,
        require_matplotlib,
        run_serve,
        save_figure,
        serve_set,
        sweep_on,
        validate_on,
        with_program,
    )
    from planner.api.sets import (
        ModelSet,
        SetInfeasible,
        SetPlan,
        SetReport,
        infeasible_set_html,
        is_set_plan,
        llama_swap_config,
        plan_set_on,
        preset_ini,
        read_model_set,
        read_set_plan,
        set_document,
        set_html,
    )

# submodule -> the names it gives (its __all__; tests/planner/test_api_surface.py holds the three lists together)
_SUBMODULES: dict[str, tuple[str, ...]] = {
    "advice": ("Choice", "Verdict", "choice_html", "choose_on", "verdict_on"),
    "calls": ("as_flags", "as_inventory", "choose", "estimate", "inspect", "plan", "plan_set", "sweep", "validate"),
    "diffusion": ("SdFitRequest", "SdPlan", "sd_fit"),
    "outputs": ("HeaderFile", "export_plan", "fetch_header", "llama_server_program"),
    "plans": (
        "LLAMA_SERVER", "OP_OFFLOAD", "Companions", "PlanRequest", "PlanResult", "choose_request", "deployment",
        "deployment_yaml", "infeasible_page", "llama_argv", "parse_cache_type", "parse_cache_types", "parse_ctx",
        "plan_argv", "plan_on", "plan_page", "plan_request", "read_deployment", "report_page", "server_command"),
    "sets": (
        "ModelSet", "SetInfeasible", "SetPlan", "SetReport", "infeasible_set_html", "is_set_plan",
        "llama_swap_config", "plan_set_on", "preset_ini", "read_model_set", "read_set_plan", "set_document",
        "set_html"),
    "runs": (
        "BudgetedEstimate", "CalibrateRequest", "CalibrateResult", "InstanceCheck", "MemoryCheck", "PreparedServe",
        "ServeRequest", "ServeResult", "SweepResult", "ValidateReport", "Workload", "calibrate",
        "check_table", "estimate_on", "plot_plan", "plot_sweep", "prepare_router", "prepare_serve",
        "require_matplotlib", "run_serve", "save_figure", "serve_set", "sweep_on", "validate_on", "with_program"),
}
_LAZY = {name: module for module, names in _SUBMODULES.items() for name in names}

__all__ = [
    "AUTO", "CATALOG_KINDS", "DEFAULT_STEPS", "LLAMA_CPP_PIN", "LOOPBACK", "BadInput", "DevicesReport", "Engine",
    "Feature", "Objective", "OpOffload", "OptionEnum", "Program", "Solver", "SplitMode", "SweepMode",
    "FileRole", "FitplanError", "FlagError", "InfeasiblePlacement", "InventoryChoice", "InventoryError",
    "InventoryOptions", "ModelSource", "ToolsError", "UsageError", "check_output_path", "devices_report",
    "ensure_tools", "legacy_modes", "list_catalog", "net", "network_settings", "one_of", "render", "rpc_endpoints",
    "tools_dir", "write_atomic", *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'planner.api' has no attribute {name!r}")
    return getattr(importlib.import_module(f"planner.api.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
