"""`fitplan sweep`: evaluate every combination of a few llama.cpp knobs and tabulate the memory.

The axes and their syntax: planner/sweeps/axes.py (ctx, np, ub, cache/ctk/ctv, ts, budget, memory).
`memory` replaces every device's total and free memory (hardware the user does not have); `budget`
caps what a plan may use of the memory a device has, and a budget above it is said, never silent.
Each combination is the base flags with the axes' flags appended (a later flag wins, as in
llama.cpp's parser), then evaluated by one of two modes:
  estimate  what llama.cpp allocates for exactly those flags (cheap: the model is read once);
  plan      the planner's best placement under the budgets (it picks -ngl, -ts, -ot, and -ub
            unless ub is varied); `ctx=max` asks it for the largest context that fits.
A point fits when every device's total and overhead (planner/llama/overhead.py) are within its budget
(planner/hardware/budgets.py semantics;
Host only when the inventory knows the host's RAM) and, in plan mode, a placement was found.
"""
from __future__ import annotations

import csv
import io
import itertools
import logging
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import IO, Any

from planner.core.choices import SweepMode
from planner.core.errors import BadInput, FlagError, InfeasiblePlacement
from planner.core.render import layer_ranges, table
from planner.core.units import fmt_mib
from planner.hardware.budgets import Budgets, resolve_budgets
from planner.hardware.inventory import Inventory
from planner.llama.context import ModelContext, ModelLike, model_context
from planner.llama.flags import LlamaFlags, changed_fields, flags_to_argv
from planner.llama.placement import HOST, HOST_ROWS, device_of
from planner.llama.settings import resolve_settings
from planner.memory.estimate import Estimate, estimate
from planner.search.contexts import above_train_warning
from planner.search.result import PlanRequest
from planner.search.search import plan
from planner.sweeps.axes import (
    AXES,
    CTX_MAX,
    MODES,
    TS_STEPS,
    Axis,
    AxisKind,
    apply_axes,
    fmt_budget,
    parse_axis,
    parse_vary,
)

log = logging.getLogger(__name__)

__all__ = ["AXES", "CSV_COLUMNS", "Axis", "AxisKind", "DeviceRow", "Point", "SweepResult", "layer_ranges",
           "parse_axis", "parse_vary", "sweep"]


@dataclass(frozen=True)
class DeviceRow:
    name: str
    model_bytes: int
    context_bytes: int
    compute_bytes: int
    budget_bytes: int | None   # None: no budget is known for this row (Host without RAM figures)
    layers: str                # layer ranges, `output` for the output layer
    budget_capped: bool = False   # the budget asked for is above the device's free memory, which caps it
    overhead_bytes: int = 0       # held outside llama.cpp's breakdown (planner/llama/overhead.py)

    @property
    def total_bytes(self) -> int:
        return self.model_bytes + self.context_bytes + self.compute_bytes

    @property
    def fits(self) -> bool:
        """The rows and the overhead within the budget."""
        return self.budget_bytes is None or self.total_bytes + self.overhead_bytes <= self.budget_bytes


@dataclass(frozen=True)
class Point:
    settings: tuple[Any, ...]   # one value per axis, in the result's axis order
    flags: str
    n_ctx: int
    devices: tuple[DeviceRow, ...]
    feasible: bool = True            # plan mode: a placement was found
    tokens_per_s: float | None = None  # plan mode: predicted decode speed
    pool_fits: bool | None = None    # Host and the UMA devices within their shared pool (None: no pool)
    warning: str | None = None       # plan mode: the plan's warning (said once per sweep, not per point)

    @property
    def fits(self) -> bool:
        return self.feasible and all(d.fits for d in self.devices) and self.pool_fits is not False

    def device(self, name: str) -> DeviceRow | None:
        return next((d for d in self.devices if d.name == name), None)


@dataclass(frozen=True)
class SweepResult:
    model: str
    mode: SweepMode
    axes: tuple[Axis, ...]
    points: tuple[Point, ...]

    @property
    def device_names(self) -> list[str]:
        """Every device row name, in the order the points list them."""
        return list(dict.fromkeys(d.name for p in self.points for d in p.devices))

    def csv_columns(self) -> list[str]:
        extra = ["feasible", "tokens_per_s"] if self.mode is SweepMode.PLAN else []
        return [a.name for a in self.axes] + list(CSV_COLUMNS) + extra

    def csv_rows(self) -> list[dict[str, Any]]:
        """One row per point and device (the CSV's rows, in its column order)."""
        rows: list[dict[str, Any]] = []
        for p in self.points:
            head = {a.name: a.text(v) for a, v in zip(self.axes, p.settings, strict=True)}
            if not p.devices:   # an infeasible plan: one row that says so
                rows.append(dict(head, fits=0, feasible=0))
            for d in p.devices:
                row = dict(head, device=d.name, model_bytes=d.model_bytes, context_bytes=d.context_bytes,
                           compute_bytes=d.compute_bytes, total_bytes=d.total_bytes, overhead_bytes=d.overhead_bytes,
                           budget_bytes="" if d.budget_bytes is None else d.budget_bytes,
                           budget_capped=int(d.budget_capped),
                           pool_fits="" if p.pool_fits is None else int(p.pool_fits),
                           device_fits=int(d.fits), fits=int(p.fits), layers=d.layers, n_ctx=p.n_ctx, flags=p.flags)
                if self.mode is SweepMode.PLAN:
                    row.update(feasible=int(p.feasible),
                               tokens_per_s="" if p.tokens_per_s is None else f"{p.tokens_per_s:.2f}")
                rows.append(row)
        return rows

    def write_csv(self, out: IO[str]) -> None:
        writer = csv.DictWriter(out, fieldnames=self.csv_columns(), lineterminator="\n", restval="")
        writer.writeheader()
        writer.writerows(self.csv_rows())

    def to_csv(self) -> str:
        buf = io.StringIO()
        self.write_csv(buf)
        return buf.getvalue()

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "mode": self.mode.value,
            "axes": {a.name: [a.text(v) for v in a.values] for a in self.axes},
            "points": [{
                "settings": {a.name: a.text(v) for a, v in zip(self.axes, p.settings, strict=True)},
                "flags": p.flags, "n_ctx": p.n_ctx, "fits": p.fits, "feasible": p.feasible,
                "pool_fits": p.pool_fits,
                "tokens_per_s": p.tokens_per_s,
                "devices": [{"name": d.name, "model_bytes": d.model_bytes, "context_bytes": d.context_bytes,
                             "compute_bytes": d.compute_bytes, "overhead_bytes": d.overhead_bytes,
                             "budget_bytes": d.budget_bytes, "budget_capped": d.budget_capped, "layers": d.layers}
                            for d in p.devices],
            } for p in self.points],
        }

    def to_table(self) -> str:
        names = self.device_names
        rows = []
        for p in self.points:
            cells = [a.text(v) for a, v in zip(self.axes, p.settings, strict=True)]
            for n in names:
                d = p.device(n)
                cells.append("" if d is None else fmt_mib(d.total_bytes)
                             + ("" if d.budget_bytes is None else f" / {fmt_mib(d.budget_bytes)}")
                             + ("*" if d.budget_capped else ""))
            speed = [] if self.mode is not SweepMode.PLAN else [f"{p.tokens_per_s:.1f}" if p.tokens_per_s else ""]
            rows.append(cells + [p.n_ctx or ""] + speed + ["yes" if p.fits else "no"])
        heads = ([a.name for a in self.axes] + [f"{n} MiB" for n in names] + ["n_ctx"]
                 + (["decode tok/s"] if self.mode is SweepMode.PLAN else []) + ["fits"])
        align = "l" * len(self.axes) + "r" * (len(heads) - len(self.axes) - 1) + "l"
        capped = any(d.budget_capped for p in self.points for d in p.devices)
        note = "\n* budget above the device's memory: capped at its free memory (vary memory= for a bigger card)\n"
        body = table(heads, rows, align=align) + "\n" + (note if capped else "")
        return f"{self.model} ({self.mode.value})\n\n" + body


# LlamaFlags fields a plan-mode base may set: the rest is placement, which the plan decides.
PLAN_BASE_FIELDS = frozenset({"n_ctx", "n_parallel", "n_ubatch", "cache_type_k", "cache_type_v", "flash_attn"})

# The CSV's columns after the axis columns (README "fitplan sweep" documents each).
CSV_COLUMNS = ("device", "model_bytes", "context_bytes", "compute_bytes", "total_bytes", "overhead_bytes",
               "budget_bytes", "budget_capped", "device_fits", "pool_fits", "fits", "layers", "n_ctx", "flags")


def _one_layer_steps(axis: Axis, ctx: ModelContext, flags: LlamaFlags, inventory: Inventory | None) -> Axis:
    """Replace `ts=steps` by every split k/(L-k) of the L offloaded layers between two devices."""
    if TS_STEPS not in axis.values:
        return axis

    n_dev = len(resolve_settings(ctx, flags, inventory).devices)
    if n_dev != 2:
        raise FlagError(f"--vary ts={TS_STEPS}: one-layer steps move layers between two devices; "
                        f"these flags and devices give {n_dev}")
    n_all = ctx.facts.n_layer_all + 1   # the output layer counts as a layer in the split
    offloaded = n_all if flags.n_gpu_layers < 0 else min(flags.n_gpu_layers, n_all)
    steps = [f"{k}/{offloaded - k}" for k in range(1, offloaded)]
    values = [v for x in axis.values for v in (steps if x == TS_STEPS else [x])]
    return Axis(axis.name, tuple(dict.fromkeys(values)))


def with_memory(inventory: Inventory, n_bytes: int) -> Inventory:
    """The inventory with every device's total and free memory set to `n_bytes` (`--vary memory=`)."""
    return replace(inventory, devices=tuple(replace(d, total_bytes=n_bytes, free_bytes=n_bytes)
                                            for d in inventory.devices))


class _Budgets:
    """Budgets for each (memory, budget) value pair, resolved once (resolve_budgets logs its warnings
    once, and so does the warning that a budget is above a device's memory)."""

    def __init__(self, inventory: Inventory | None, max_vram: str | None = None, max_ram: str | None = None) -> None:
        self.base = inventory
        self.max_vram = max_vram    # the budgets without a budget axis value (--max-vram)
        self.max_ram = max_ram
        self.cache: dict[tuple[int | None, int | None], Budgets] = {}
        self.capped: dict[tuple[int | None, int | None], frozenset[str]] = {}

    def inventory(self, memory: int | None) -> Inventory | None:
        if self.base is None or memory is None:
            return self.base
        return with_memory(self.base, memory)

    def get(self, amount: int | None, memory: int | None = None) -> Budgets | None:
        inventory = self.inventory(memory)
        if inventory is None:
            return None
        key = (memory, amount)
        if key not in self.cache:
            vram = self.max_vram if amount is None else fmt_budget(amount)
            self.cache[key] = resolve_budgets(inventory, vram, self.max_ram)
            self.capped[key] = frozenset(_over_memory(inventory, amount))
        return self.cache[key]

    def rows(self, amount: int | None, memory: int | None = None) -> dict[str, int]:
        """Row name -> budget; Host only when the inventory knows the host's RAM."""
        b, inventory = self.get(amount, memory), self.inventory(memory)
        if b is None or inventory is None:
            return {}
        return dict(b.devices, **({HOST: b.host_bytes} if inventory.host.ram_available_bytes else {}))

    def capped_names(self, amount: int | None, memory: int | None = None) -> frozenset[str]:
        self.get(amount, memory)
        return self.capped.get((memory, amount), frozenset())


def _over_memory(inventory: Inventory, amount: int | None) -> list[str]:
    """Devices whose free memory is below a budget axis value (they are capped at it), with a warning."""
    if amount is None or amount < 0:
        return []
    names = [d.name for d in inventory.devices if amount > d.free_bytes]
    for d in inventory.devices:
        if d.name in names:
            log.warning("--vary budget=%s is above %s's %s of free memory: its budget is capped there "
                        "(--vary memory= models a bigger device)", fmt_budget(amount), d.name,
                        fmt_budget(d.free_bytes))
    return names


def _rows(est: Estimate, limit: dict[str, int], capped: frozenset[str] = frozenset()) -> tuple[DeviceRow, ...]:
    by_dev = dict(est.layers)
    return tuple(DeviceRow(d.name, d.model_bytes, d.context_bytes, d.compute_bytes, limit.get(d.name),
                           layer_ranges(by_dev.get(device_of(d.name), ()), est.n_layer_all), d.name in capped,
                           d.overhead_bytes)
                 for d in est.devices)


def _pool_fits(budgets: Budgets | None, rows: tuple[DeviceRow, ...]) -> bool | None:
    """Whether Host (every host row) and the UMA devices fit their one pool; None without a pool
    or without the host's RAM (the pool is the host's budget)."""
    if budgets is None or budgets.uma_pool_bytes is None or not budgets.host_bytes:
        return None
    totals = {d.name: d.total_bytes + d.overhead_bytes for d in rows if d.name not in HOST_ROWS}
    totals[HOST] = sum(d.total_bytes for d in rows if d.name in HOST_ROWS)
    return budgets.pool_excess(totals) == 0


def _axis_value(settings: Sequence[tuple[Axis, Any]], name: str) -> Any:
    return next((v for a, v in settings if a.name == name), None)


def _estimate_point(ctx: ModelContext, axes: tuple[Axis, ...], combo: tuple[Any, ...], base: LlamaFlags,
                    inventory: Inventory | None, budgets: _Budgets) -> Point:

    settings = list(zip(axes, combo, strict=True))
    if CTX_MAX in combo:
        raise FlagError("--vary ctx=max: the largest context that fits is a plan's question; use --mode plan")
    flags = apply_axes(base, [(a, v) for a, v in settings if a.spec.flags],
                       " ".join(f"{a.name}={a.text(v)}" for a, v in settings))
    amount, memory = _axis_value(settings, "budget"), _axis_value(settings, "memory")
    est = estimate(ctx, flags, budgets.inventory(memory))
    rows = _rows(est, budgets.rows(amount, memory), budgets.capped_names(amount, memory))
    return Point(combo, shlex.join(flags_to_argv(flags)), est.cparams.n_ctx, rows,
                 pool_fits=_pool_fits(budgets.get(amount, memory), rows))


def sweep(model: ModelLike, axes: Sequence[Axis], inventory: Inventory | None = None, flags: LlamaFlags | None = None,
          mode: SweepMode | str = SweepMode.ESTIMATE,
          progress: Callable[[int, int], None] | None = None,
          max_vram: str | None = None, max_ram: str | None = None) -> SweepResult:
    """Evaluate every combination of `axes` (the first axis varies slowest); `progress(done, total)`
    is called after each point. `max_vram`/`max_ram` are the budgets as `--max-vram`/`--max-ram`
    take them (a `budget` axis value replaces `max_vram`)."""

    if mode not in MODES:
        raise FlagError(f"sweep mode {mode!r}: expected one of {', '.join(MODES)}")
    mode = SweepMode(mode)
    _check_axes(axes, inventory)
    base = flags or LlamaFlags()
    ctx = model_context(model)
    axes = tuple(_one_layer_steps(a, ctx, base, inventory) for a in axes)
    combos = list(itertools.product(*(a.values for a in axes)))
    budgets = _Budgets(inventory, max_vram, max_ram)
    evaluate = _estimate_point if mode is SweepMode.ESTIMATE else _plan_point
    points = []
    for i, combo in enumerate(combos):
        points.append(evaluate(ctx, axes, combo, base, inventory, budgets))
        if progress is not None:
            progress(i + 1, len(combos))
    for warning in dict.fromkeys(p.warning for p in points if p.warning):
        log.warning("%s", warning)
    return SweepResult(ctx.model.path, mode, axes, tuple(points))


def _check_axes(axes: Sequence[Axis], inventory: Inventory | None) -> None:
    """At least one axis, each setting varied once (`cache` sets both ctk and ctv), and `memory` only with
    devices to set it on."""
    if not axes:
        raise FlagError("sweep: nothing to vary; expected at least one --vary NAME=VALUES")
    names = [a.name for a in axes]
    if "memory" in names and (inventory is None or not inventory.devices):
        raise FlagError("--vary memory: sets the memory of the inventory's devices; expected --device or --devices")
    clash = [n for n in names if names.count(n) > 1] or (["cache"] if "cache" in names and
                                                           {"ctk", "ctv"} & set(names) else [])
    if clash:
        raise FlagError(f"--vary {clash[0]}: given twice (cache sets both ctk and ctv)")


def _plan_point(ctx: ModelContext, axes: tuple[Axis, ...], combo: tuple[Any, ...], base: LlamaFlags,
                inventory: Inventory | None, budgets: _Budgets) -> Point:
    """The planner's best placement for this combination (it chooses -ngl, -ts, -ot and -ub)."""

    settings = list(zip(axes, combo, strict=True))
    where = " ".join(f"{a.name}={a.text(v)}" for a, v in settings)
    if inventory is None or not inventory.host.ram_available_bytes:
        raise BadInput("sweep --mode plan: the host's RAM is needed (--ram 64GiB, or an inventory YAML)")
    if any(a.name == "ts" for a in axes):
        raise FlagError("--vary ts: a plan chooses -ts itself; vary ts with --mode estimate")
    chosen_by_plan = set(changed_fields(base)) - PLAN_BASE_FIELDS
    if chosen_by_plan:
        raise FlagError(f"sweep --mode plan: the plan chooses placement itself; base flags may set only "
                        f"-c, -np, -ub, -ctk/-ctv and -fa (got {', '.join(sorted(chosen_by_plan))})")
    want_max = any(a.name == "ctx" and v == CTX_MAX for a, v in settings)
    flags = apply_axes(base, [(a, v) for a, v in settings if a.spec.flags and v != CTX_MAX], where)
    if flags.cache_type_k != flags.cache_type_v:
        raise FlagError(f"{where}: a plan uses one KV cache type for K and V; "
                        f"got {flags.cache_type_k}/{flags.cache_type_v}")
    ub_given = flags.n_ubatch != LlamaFlags().n_ubatch or any(a.name == "ub" for a in axes)
    request = PlanRequest(n_ctx=None if want_max else (flags.n_ctx or None), max_ctx=want_max,
                          n_parallel=flags.n_parallel, cache_types=(flags.cache_type_k,),
                          n_ubatch=flags.n_ubatch if ub_given else None, flash_attn=flags.flash_attn)
    amount, memory = _axis_value(settings, "budget"), _axis_value(settings, "memory")
    hardware = budgets.inventory(memory) or inventory
    try:
        result = plan(ctx, hardware, request, budgets=budgets.get(amount, memory), warn=False)
    except InfeasiblePlacement:
        return Point(combo, "", 0, (), feasible=False)
    rows = _rows(result.estimate, budgets.rows(amount, memory), budgets.capped_names(amount, memory))
    return Point(combo, shlex.join(flags_to_argv(result.flags)), result.n_ctx, rows,
                 tokens_per_s=result.prediction.decode_tokens_s,
                 pool_fits=_pool_fits(budgets.get(amount, memory), rows),
                 warning=above_train_warning(ctx, result.flags))
