"""`estimate`, `sweep`, `validate`, `serve` and `calibrate` for the command line: one call each on
the machine a command resolved (planner.api.machine), the results and what draws them.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from planner.api.calls import sd_sweep, validate_in
from planner.api.machine import InventoryChoice, InventoryOptions
from planner.checking.validate import validate_request
from planner.checking.validation_report import ValidateReport, ValidateRequest
from planner.core.choices import Program, SweepMode
from planner.core.errors import BadInput
from planner.core.units import fmt_mib
from planner.hardware.budgets import Budgets, pool_members
from planner.llama.flags import parse_llama_flags
from planner.llama.placement import HOST, HOST_ROWS
from planner.measuring.calibrate import CalibrateRequest, CalibrateResult, calibrate
from planner.measuring.llama_bench import Workload
from planner.memory.estimate import Estimate
from planner.memory.estimate import estimate as run_estimate
from planner.running.serve import (
    MemoryCheck,
    PreparedServe,
    ServeRequest,
    ServeResult,
    prepare_serve,
    run_serve,
    with_program,
)
from planner.running.serve_set import InstanceCheck, check_table, prepare_router, serve_set
from planner.sd.res_sweep import ResSweep
from planner.sweeps.plots import plot_plan, plot_sweep, require_matplotlib, save_figure
from planner.sweeps.sweep import SweepResult, parse_vary
from planner.sweeps.sweep import sweep as run_sweep

__all__ = [
    "BudgetedEstimate", "CalibrateRequest", "CalibrateResult", "InstanceCheck", "MemoryCheck", "PreparedServe",
    "ServeRequest", "ServeResult", "SweepResult", "ValidateReport", "Workload", "calibrate",
    "check_table", "estimate_on", "plot_plan", "plot_sweep", "prepare_router", "prepare_serve", "require_matplotlib",
    "run_serve", "save_figure", "serve_set", "sweep_on", "validate_on", "with_program",
]


@dataclass(frozen=True)
class BudgetedEstimate:
    """An estimate checked against `--max-vram`/`--max-ram`: the estimate's own output, plus each
    budget and whether the total is within it."""

    estimate: Estimate
    budgets: dict[str, int]     # row name -> bytes
    resolved: Budgets | None = None   # where Host shares one pool with UMA devices (seed 003 §7)

    @property
    def totals(self) -> dict[str, int]:
        """Budgeted row -> bytes; the host's rows (Host, CPU_REPACK, ...) count against Host's budget, a device's
        overhead outside llama.cpp's breakdown against its own."""
        out = {d.name: d.held_bytes for d in self.estimate.devices if d.name not in HOST_ROWS}
        out[HOST] = sum(d.total_bytes for d in self.estimate.devices if d.name in HOST_ROWS)
        return {name: n for name, n in out.items() if name in self.budgets}

    @property
    def pool(self) -> tuple[str, int, int] | None:
        """The shared pool's label (Host+Vulkan0), the bytes its members use together, and its budget."""
        members = pool_members(self.resolved) if self.resolved and HOST in self.budgets else []
        if not members or self.resolved is None or self.resolved.uma_pool_bytes is None:
            return None
        used = sum(n for name, n in self.totals.items() if name in members)
        return "+".join(members), used, self.resolved.uma_pool_bytes

    @property
    def over(self) -> list[str]:
        names = [name for name, n in self.totals.items() if n > self.budgets[name]]
        pool = self.pool
        return names + ([pool[0]] if pool and pool[1] > pool[2] else [])

    def to_dict(self) -> dict[str, Any]:
        out = {**self.estimate.to_dict(), "budgets": self.budgets, "fits": not self.over}
        if self.pool:
            label, used, budget = self.pool
            out["shared_pool"] = {"devices": label.split("+"), "bytes": used, "budget_bytes": budget}
        return out

    def to_table(self) -> str:
        rows = [f"{name} {fmt_mib(n)} of {fmt_mib(self.budgets[name])} MiB" for name, n in self.totals.items()]
        if self.pool:
            label, used, budget = self.pool
            rows.append(f"{label} together {fmt_mib(used)} of {fmt_mib(budget)} MiB")
        if not rows:
            return self.estimate.to_table().rstrip("\n") + "\n\nbudgets: none for these devices"
        verdict = "fits" if not self.over else "does not fit on " + ", ".join(self.over)
        return self.estimate.to_table().rstrip("\n") + "\n\nbudgets: " + "; ".join(rows) + f" ({verdict})"


def estimate_on(model: str, options: InventoryOptions, argv: list[str],
                program: Program | str = Program.FIT_PARAMS) -> Estimate | BudgetedEstimate:
    """`estimate`: what llama.cpp allocates for the flags on the devices the options give; checked
    against the budgets when --max-vram or --max-ram is given."""
    sized_for = Program(program)
    choice = options.resolve(detect=False)
    est = run_estimate(model, options.llama_argv(argv), choice.inventory if choice else None, program=sized_for)
    if choice is None or not (options.max_vram or options.max_ram):
        return est
    return BudgetedEstimate(est, choice.budget_rows(), choice.budgets)


def sweep_on(model: str, vary: Sequence[str], options: InventoryOptions, argv: list[str],
             mode: SweepMode | str = SweepMode.ESTIMATE,
             progress: Callable[[int, int], None] | None = None, drawing: bool = False) -> SweepResult | ResSweep:
    """`sweep`: each --vary NAME=VALUES axis over the base flags, on the devices the options give. A `res`
    axis makes it a stable-diffusion.cpp sweep (sd-fit at each side; `argv` are then sd-cli's flags)."""
    axes = [parse_vary(v) for v in vary]
    if any(a.name == "res" for a in axes):
        if drawing:
            raise BadInput("--plot: not drawn for a sweep over res; use -o or --format")
        choice = options.resolve(detect=False)
        return sd_sweep([model], axes, argv, choice.inventory if choice else None, options.max_vram, progress)
    args = options.llama_argv(argv)
    base = parse_llama_flags(args) if args else None
    choice = options.resolve(detect=False)
    return run_sweep(model, axes, choice.inventory if choice else None, base, mode=mode, progress=progress,
                     max_vram=options.max_vram, max_ram=options.max_ram)


def validate_on(target: str, options: InventoryOptions, argv: list[str], n_prompt: int, n_gen: int,
                engine: str = "embedded", kernels: str = "default", reserve_only: bool = False) -> ValidateReport:
    """`validate`: a plan file (which carries its own flags, inventory and budgets), or a model under
    the flags on the devices the options give."""
    if target.endswith((".yaml", ".yml")):
        if options != InventoryOptions():
            raise BadInput("a plan file carries its own flags, inventory and budgets: give nothing else")
        req = validate_request(target, argv, n_prompt=n_prompt, n_gen=n_gen)
    else:
        choice: InventoryChoice | None = options.resolve(detect=False)
        req = ValidateRequest(target, parse_llama_flags(options.llama_argv(argv)),
                              choice.inventory if choice else None, choice.budget_rows() if choice else {},
                              n_prompt, n_gen)
    return validate_in(req, engine, kernels, reserve_only)

