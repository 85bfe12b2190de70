"""fitplan's public Python API: one call per command, plain inputs, a frozen dataclass out.

Every result has `to_dict()` (the same data `--format json` prints) and `to_table()`.
Inputs take the forms a notebook has at hand:
  model    a GGUF path, `example:NAME`, or a `planner.llama.context.ModelContext` read once
  flags    llama.cpp flags as one string ("-c 8192 -ts 1,1"), a list of arguments, or LlamaFlags
  devices  None (no GPU), an Inventory, a YAML inventory path, or `--device` shorthands
           (["CUDA0=24GiB", "2xrtx3090"]; `ram` sets the host's RAM as `--ram` does)
"""
from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from planner.checking.validate import validate as run_validate
from planner.checking.validate import validate_request
from planner.checking.validation_report import (
    DEFAULT_GEN_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    ValidateReport,
    ValidateRequest,
    with_budgets,
)
from planner.core.choices import Engine, Program, SweepMode
from planner.core.errors import BadInput
from planner.emit.set_document import SetReport
from planner.hardware.budgets import resolve_budgets
from planner.hardware.inventory import Inventory
from planner.hardware.inventory_yaml import inventory_from_cli, inventory_from_options
from planner.llama.context import ModelLike
from planner.llama.flags import LlamaFlags, flags_to_argv, parse_llama_flags
from planner.memory.estimate import Estimate
from planner.memory.estimate import estimate as run_estimate
from planner.model.inspect import InspectResult
from planner.model.inspect import inspect as run_inspect
from planner.registry.candidates import MAX_CANDIDATES
from planner.running.validate_llama import validate_with_llama
from planner.sd.argv import request_from_argv
from planner.sd.res_sweep import ResSweep, res_sweep
from planner.search.result import PlanRequest, PlanResult
from planner.search.search import plan as run_plan
from planner.search.set_input import ModelSet, read_model_set
from planner.search.set_plan import plan_set as run_plan_set
from planner.sweeps.axes import Axis
from planner.sweeps.choose import Choice
from planner.sweeps.choose import choose as run_choose
from planner.sweeps.sweep import SweepResult, parse_axis
from planner.sweeps.sweep import sweep as run_sweep

__all__ = ["as_flags", "as_inventory", "choose", "estimate", "inspect", "plan", "plan_set", "sweep", "validate"]

Devices = Inventory | str | os.PathLike | Sequence[str] | None
Flags = str | Sequence[str] | LlamaFlags


def as_inventory(devices: Devices, ram: str | None = None) -> Inventory | None:
    """An Inventory from any accepted `devices` form (None stays None unless `ram` is given)."""
    if isinstance(devices, Inventory):
        return inventory_from_cli([], ram, devices) if ram else devices
    if isinstance(devices, (str, os.PathLike)):
        return inventory_from_options(Path(devices), [], ram)
    return inventory_from_options(None, list(devices or ()), ram)


def as_flags(flags: Flags) -> LlamaFlags:
    if isinstance(flags, LlamaFlags):
        return flags
    return parse_llama_flags(shlex.split(flags) if isinstance(flags, str) else list(flags))


def _argv(flags: Flags) -> list[str]:
    if isinstance(flags, LlamaFlags):
        return flags_to_argv(flags)
    return shlex.split(flags) if isinstance(flags, str) else list(flags)


def inspect(model: str, cache_type_k: str = "f16", cache_type_v: str = "f16") -> InspectResult:
    """Per-layer weights, KV bytes per cell and recurrent state of a model (`fitplan inspect`)."""
    return run_inspect(str(model), cache_type_k, cache_type_v)


def estimate(model: ModelLike, flags: Flags = (), devices: Devices = None, ram: str | None = None,
             program: Program | str = Program.FIT_PARAMS) -> Estimate:
    """What llama.cpp would allocate on each device for `flags` (`fitplan estimate`): as llama-fit-params'
    dry run prints it, or (`program="server"`) as llama-server loads it, with its -np default when the
    flags are given as text or a list."""
    sized_for = Program(program)
    given = flags if isinstance(flags, LlamaFlags) else _argv(flags)
    return run_estimate(model, given, as_inventory(devices, ram), program=sized_for)


def sweep(model: ModelLike, vary: Mapping[str, str | Sequence[Any]], devices: Devices = None, flags: Flags = (),
          ram: str | None = None, mode: SweepMode | str = SweepMode.ESTIMATE,
          progress: Callable[[int, int], None] | None = None) -> SweepResult:
    """Every combination of the `vary` axes (`{"ctx": "4096..65536", "cache": "f16,q8_0"}`; see
    planner.sweeps.sweep for the axes), evaluated by `mode` (`fitplan sweep`)."""
    axes = [parse_axis(name, spec) for name, spec in vary.items()]
    return run_sweep(model, axes, as_inventory(devices, ram), as_flags(flags), mode=mode, progress=progress)


def sd_sweep(models: Sequence[str], axes: Sequence[Axis], sd_argv: Sequence[str], inventory: Inventory | None,
             max_vram: str | None = None, progress: Callable[[int, int], None] | None = None) -> ResSweep:
    """`fitplan sweep` of a stable-diffusion.cpp model over the `res` axis: sd-fit at each square
    side, with the sd-cli flags `sd_argv` (a --max-vram there wins over `max_vram`)."""
    if inventory is None:
        raise BadInput("sweep --vary res: sd-fit plans for devices; expected --device or --devices")
    others = [a.name for a in axes if a.name != "res"]
    if others:
        raise BadInput(f"sweep --vary res: a stable-diffusion.cpp sweep varies res alone (got {', '.join(others)})")
    request = request_from_argv(list(models), sd_argv)
    if request.max_vram is None and max_vram is not None:
        request = replace(request, max_vram=max_vram)
    sides = [v for a in axes for v in a.values]
    return res_sweep(request, inventory, sides, progress)


def plan(model: ModelLike, devices: Devices = None, ram: str | None = None, request: PlanRequest | None = None,
         max_vram: str | None = None, max_ram: str | None = None, **fields: Any) -> PlanResult:
    """The best placement of a model on devices under budgets (`fitplan plan`). `request` or its
    fields as keywords (`n_ctx=32768, n_parallel=2`; planner.search.result.PlanRequest); `ram` is the
    host's RAM, `max_vram` / `max_ram` the budgets as the command line takes them."""
    inventory = as_inventory(devices, ram)
    if inventory is None or not inventory.host.ram_available_bytes:
        raise BadInput("plan: the host's RAM is needed (ram='64GiB', or an inventory YAML that gives it)")
    return run_plan(model, inventory, replace(request or PlanRequest(), **fields), max_vram=max_vram, ram=max_ram,
                    what_would_fit=True)


def plan_set(models: str | ModelSet, devices: Devices = None, ram: str | None = None, max_vram: str | None = None,
             max_ram: str | None = None) -> SetReport:
    """Several models on one box (`fitplan plan-set`): `models` a set file's path (or a ModelSet read
    with planner.search.set_input.read_model_set); which are resident together, which load on
    demand, each one's plan within what the others leave (`.plan`; `.to_dict()` is the JSON)."""
    inventory = as_inventory(devices, ram)
    if inventory is None or not inventory.host.ram_available_bytes:
        raise BadInput("plan_set: the host's RAM is needed (ram='64GiB', or an inventory YAML that gives it)")
    spec = read_model_set(models) if isinstance(models, str) else models
    return SetReport(run_plan_set(spec, inventory, resolve_budgets(inventory, max_vram, max_ram)))


def choose(models: str | Sequence[str], devices: Devices = None, ram: str | None = None,
           request: PlanRequest | None = None, max_vram: str | None = None, max_ram: str | None = None,
           include: Sequence[str] = (), max_files: int = MAX_CANDIDATES, **fields: Any) -> Choice:
    """Every quantization of a repository (`hf://ORG/REPO`, `ms://…`, `ollama://NAME`), or several models,
    planned for the devices and ranked (`fitplan choose`): the highest-precision file that plans and the
    fastest. `request` or its fields as keywords, as for `plan`; `include` narrows a listing (globs)."""
    inventory = as_inventory(devices, ram)
    if inventory is None or not inventory.host.ram_available_bytes:
        raise BadInput("choose: the host's RAM is needed (ram='64GiB', or an inventory YAML that gives it)")
    budgets = resolve_budgets(inventory, max_vram, max_ram)
    return run_choose([models] if isinstance(models, str) else list(models), inventory, budgets,
                      replace(request or PlanRequest(), **fields), include, max_files)


def _budgets(req: ValidateRequest, max_vram: str | None) -> ValidateRequest:
    """Device budgets by name, the host's and the pool it shares with UMA devices when its RAM is
    known; none without devices."""
    if req.inventory is None:
        return req
    host = bool(req.inventory.host.ram_available_bytes)
    return with_budgets(req, resolve_budgets(req.inventory, max_vram), host=host)


def validate(target: str, flags: Flags = (), devices: Devices = None, ram: str | None = None,
             max_vram: str | None = None, engine: str = "embedded", n_prompt: int | None = None,
             n_gen: int | None = None) -> ValidateReport:
    """Run a model under llama.cpp flags (or a plan file from `fitplan plan -o`) in the embedded
    runtime or llama.cpp and compare what it allocates with the estimate (`fitplan validate`)."""
    n_prompt, n_gen = n_prompt or DEFAULT_PROMPT_TOKENS, n_gen or DEFAULT_GEN_TOKENS
    plan_file = str(target).endswith((".yaml", ".yml"))
    if plan_file or (ram is None and (devices is None or isinstance(devices, (str, os.PathLike)))):
        req = validate_request(str(target), [] if plan_file and not flags else _argv(flags),
                               None if devices is None else str(devices), max_vram, n_prompt=n_prompt, n_gen=n_gen)
    else:
        inventory = as_inventory(devices, ram)
        req = _budgets(ValidateRequest(str(target), as_flags(flags), inventory, n_prompt=n_prompt, n_gen=n_gen),
                       max_vram)
    return validate_in(req, engine)


def validate_in(req: ValidateRequest, engine: Engine | str = Engine.EMBEDDED, kernels: str = "default",
                reserve_only: bool = False) -> ValidateReport:
    """The check in the engine named: the embedded runtime (planner.checking) or llama.cpp's tools
    (planner.running)."""
    if Engine(engine) is Engine.LLAMA_CPP:
        return validate_with_llama(req, reserve_only)
    return run_validate(req, Engine.EMBEDDED.value, kernels, reserve_only)

