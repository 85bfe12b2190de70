"""Pictures of sweeps and placements (matplotlib, an optional dependency: `fitplan[plots]`).

Figures are built on `matplotlib.figure.Figure`, never through pyplot: no global backend is
chosen or changed, so the same functions draw headless in the CLI (Agg renders `savefig`) and
inline in a notebook (`display(fig)`). Every function returns the Figure it drew.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from planner.core.choices import SweepMode
from planner.core.errors import BadInput
from planner.core.render import layer_ranges
from planner.core.units import GiB
from planner.llama.flags import flags_to_argv
from planner.llama.placement import CPU_REPACK, HOST, HOST_ROWS, device_of
from planner.memory.estimate import Estimate
from planner.search.result import PlanResult
from planner.sweeps.axes import CTX_MAX, AxisKind
from planner.sweeps.sweep import Axis, Point, SweepResult
from planner.system.files import write_atomic

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


# One colour per memory kind, the same in every picture.
KIND_COLOURS = {"model": "#4c72b0", "context": "#55a868", "compute": "#c44e52"}
DPI = 110


class MemoryRow(Protocol):
    """A row of memory by kind: read-only, so frozen dataclasses (DeviceMemory, DeviceRow) are rows."""

    @property
    def name(self) -> str: ...

    @property
    def model_bytes(self) -> int: ...

    @property
    def context_bytes(self) -> int: ...

    @property
    def compute_bytes(self) -> int: ...


def require_matplotlib() -> None:
    """Fail early with one line (exit 2) when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401  # imported only to learn whether it is installed
    except ImportError:
        raise BadInput("plots need matplotlib: pip install 'fitplan[plots]'") from None


def _figure(width: float, height: float) -> Figure:
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def save_figure(fig: Figure, path: str | Path) -> None:
    """Save in the format the file name says (.png, .svg, .pdf), through a temporary file renamed
    into place: a failed save leaves nothing half-written."""
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    write_atomic(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=DPI))


def gib(n_bytes: float) -> float:
    return n_bytes / GiB


# --------------------------------------------------------------------------- sweeps

def _x_axis(result: SweepResult) -> Axis:
    """The first axis that takes more than one value (the user's --vary order), else the first."""
    return next((a for a in result.axes if len(a.values) > 1), result.axes[0])


def _numeric(axis: Axis) -> bool:
    """Drawn to scale: numbers (a `ctx=max` among them makes the axis categorical)."""
    return axis.spec.kind in (AxisKind.INT, AxisKind.SIZE) and all(isinstance(v, int) for v in axis.values)


def _x_positions(axis: Axis) -> dict[Any, float]:
    if not _numeric(axis):
        return {v: float(i) for i, v in enumerate(axis.values)}
    return {v: gib(v) if axis.spec.kind is AxisKind.SIZE else float(v) for v in axis.values}


def _dress_x(ax: Axes, axis: Axis, pos: dict[Any, float]) -> None:
    ax.set_xlabel(axis.spec.label)
    values = sorted(pos.values())
    if not _numeric(axis):
        step = max(1, len(values) // 12)   # at most ~12 tick labels on a categorical axis
        ax.set_xticks(values[::step], [axis.text(v) for v in axis.values][::step], rotation=45, ha="right")
        return
    ratios = {b / a for a, b in itertools.pairwise(values) if a > 0}
    if axis.name == "ctx" and len(values) > 2 and ratios == {2.0}:
        ax.set_xscale("log", base=2)    # a doubling range: evenly spaced points
        ax.set_xticks(values, [f"{int(v) // 1024}k" if v >= 1024 else str(int(v)) for v in values])
        ax.minorticks_off()


def _series(result: SweepResult, x: Axis) -> dict[str, list[Point]]:
    """Points grouped by the values of the other varying axes: label -> points, in sweep order."""
    others = [(i, a) for i, a in enumerate(result.axes) if a is not x and len(a.values) > 1]
    groups: dict[str, list[Point]] = {}
    for p in result.points:
        label = ", ".join(f"{a.name}={a.text(p.settings[i])}" for i, a in others)
        groups.setdefault(label, []).append(p)
    return groups


def _budget_bytes(p: Point, name: str) -> int | None:
    row = p.device(name)
    return row.budget_bytes if row is not None else None


def _total_gib(p: Point, name: str) -> float | None:
    row = p.device(name)
    return gib(row.total_bytes) if row is not None else None


def _budget_line(ax: Axes, points: Sequence[Point], name: str, xs: list[float], top: float) -> None:
    """The device's budget as a dashed line; a budget far above the data (more than twice the
    largest total) is written in a corner instead, so the lines keep the panel's height."""
    known = [_budget_bytes(p, name) for p in points]
    budgets = [b for b in known if b is not None]
    if not budgets or len(budgets) < len(known):
        return
    if min(gib(b) for b in budgets) > 2 * top:
        ax.text(0.98, 0.96, f"budget {gib(min(budgets)):.1f} GiB (off scale)", transform=ax.transAxes,
                ha="right", va="top", fontsize="small", color="0.3")
    elif len(set(budgets)) == 1:
        ax.axhline(gib(budgets[0]), color="0.3", linestyle="--", linewidth=1, label="budget")
    else:
        ax.plot(xs, [gib(b) for b in budgets], color="0.3", linestyle="--", linewidth=1, label="budget")


@dataclass(frozen=True)
class _Panel:
    title: str
    ylabel: str
    value: Callable[[Point], float | None]   # what a point shows; None: the point is not drawn
    device: str | None = None                # the device whose memory it shows (and whose budget)


def _panels(result: SweepResult) -> list[_Panel]:
    """Every device's total memory; in plan mode also the predicted speed and, for ctx=max, the
    context found."""
    def total(name: str) -> Callable[[Point], float | None]:
        return lambda p: _total_gib(p, name)

    panels = [_Panel(n if n != HOST else "Host (RAM)", "memory (GiB)", total(n), n) for n in result.device_names]
    if result.mode is SweepMode.PLAN:
        panels.append(_Panel("plan: predicted decode", "decode (tokens/s)", lambda p: p.tokens_per_s))
        if any(a.name == "ctx" and CTX_MAX in a.values for a in result.axes):
            panels.append(_Panel("plan: largest context that fits", "context (k tokens)",
                                 lambda p: p.n_ctx / 1024 if p.feasible else None))
    return panels


def _point_fits(p: Point, device: str | None) -> bool:
    """A plan was found, and the panel's device (when it shows one) is within its budget."""
    row = p.device(device) if device else None
    return (row.fits if row is not None else True) and p.feasible


def plot_sweep(result: SweepResult, fig: Figure | None = None) -> Figure:
    """One panel per device: its total memory (GiB) along the first varying axis, one line per
    combination of the other varying axes; hollow markers where the point does not fit."""
    panels = _panels(result)
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    fig = fig or _figure(4.2 * ncols, 3.4 * nrows)
    axs = fig.subplots(nrows, ncols, squeeze=False).ravel()
    x = _x_axis(result)
    groups = _series(result, x)
    for k, panel in enumerate(panels):
        _sweep_panel(axs[k], panel, result, x, groups)
        if k == 0 and (len(groups) > 1 or axs[k].get_legend_handles_labels()[0]):
            axs[k].legend(fontsize="small")
    for ax in axs[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(f"{Path(result.model).name}: memory per device (hollow: over budget)", fontsize="medium")
    return fig


def _sweep_panel(ax: Axes, panel: _Panel, result: SweepResult, x: Axis, groups: dict[str, list[Point]]) -> None:
    """One panel of plot_sweep: a line per group of points, the device's budget where the panel shows one."""
    xi = result.axes.index(x)
    pos = _x_positions(x)
    for n, (label, points) in enumerate(groups.items()):
        drawn = [(p, y) for p in points if (y := panel.value(p)) is not None]
        _sweep_line(ax, [pos[p.settings[xi]] for p, _ in drawn], [y for _, y in drawn],
                    [_point_fits(p, panel.device) for p, _ in drawn], label or "total", f"C{n}")
    if panel.device is not None:
        first = [p for p in next(iter(groups.values())) if p.device(panel.device)]
        top = max((v for p in result.points if (v := panel.value(p)) is not None), default=0.0)
        _budget_line(ax, first, panel.device, [pos[p.settings[xi]] for p in first], top)
    ax.set_title(panel.title)
    ax.set_ylabel(panel.ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    _dress_x(ax, x, pos)


def _sweep_line(ax: Axes, xs: list[float], ys: list[float], fits: list[bool], label: str, colour: str) -> None:
    """A line through the points, solid markers where a point fits and hollow ones where it does not."""
    line, = ax.plot(xs, ys, label=label, color=colour)
    ax.scatter([a for a, f in zip(xs, fits, strict=True) if f], [b for b, f in zip(ys, fits, strict=True) if f],
               color=line.get_color(), s=16, zorder=3)
    ax.scatter([a for a, f in zip(xs, fits, strict=True) if not f],
               [b for b, f in zip(ys, fits, strict=True) if not f],
               facecolors="none", edgecolors=line.get_color(), s=28, zorder=3)


# --------------------------------------------------------------------------- placements

def _bars(ax: Axes, rows: Sequence[MemoryRow], budgets: Mapping[str, int], layers: Mapping[str, str]) -> None:
    xs = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for kind, colour in KIND_COLOURS.items():
        heights = [gib(getattr(r, f"{kind}_bytes")) for r in rows]
        ax.bar(xs, heights, bottom=bottom, color=colour, label=kind, width=0.6)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    labelled = False
    for x, r in enumerate(rows):
        if r.name in budgets:
            # one legend entry for all budget marks ("" is hlines' default: no entry)
            ax.hlines(gib(budgets[r.name]), x - 0.4, x + 0.4, colors="k", linestyles="--", linewidth=1.2,
                      label="" if labelled else "budget")
            labelled = True
        if layers.get(r.name):
            top = max(bottom[x], gib(budgets.get(r.name, 0)))
            ax.annotate(f"layers {layers[r.name]}", (x, top), xytext=(0, 4), textcoords="offset points",
                        ha="center", va="bottom", fontsize="small")
    ax.set_xticks(xs, [r.name for r in rows])
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_ylabel("memory (GiB)")
    ax.margins(y=0.15)
    ax.grid(True, axis="y", alpha=0.3)


def plot_memory(rows: Sequence[MemoryRow], budgets: Mapping[str, int] | None = None,
                layers: Mapping[str, str] | None = None, title: str = "", fig: Figure | None = None) -> Figure:
    """Per-device stacked bars (model, context, compute; GiB) against each device's budget (dashed),
    the layer ranges each device holds written above its bar. Host memory (Host, CPU_REPACK) gets
    its own panel and scale: RAM budgets are often ten times a GPU's."""
    budgets, layers = budgets or {}, layers or {}
    groups = [g for g in ([r for r in rows if r.name not in HOST_ROWS],
                          [r for r in rows if r.name in HOST_ROWS]) if g]
    fig = fig or _figure(max(4.5, 1.4 * len(rows) + 2.5), 4.2)
    axs = fig.subplots(1, len(groups), squeeze=False, width_ratios=[len(g) + 0.5 for g in groups])[0]
    # one or two panels: zip stops at the groups drawn
    for ax, group, label in zip(axs, groups, ("device", "host memory"), strict=False):
        _bars(ax, group, budgets, layers)
        ax.set_xlabel(label if len(groups) > 1 else "device")
    handles, names = axs[0].get_legend_handles_labels()
    for ax in axs[1:]:   # the budget entry may only exist in the host panel
        for h, n in zip(*ax.get_legend_handles_labels(), strict=True):
            if n not in names:
                handles, names = handles + [h], names + [n]
    fig.legend(handles, names, fontsize="small", loc="outside lower center", ncols=len(names))
    if title:
        fig.suptitle(title, fontsize="medium")
    return fig


def plot_estimate(est: Estimate, budgets: Mapping[str, int] | None = None, fig: Figure | None = None) -> Figure:
    """An estimate's memory per device, with the layers each holds (the host's are the CPU's)."""

    by_dev = dict(est.layers)
    layers = {d.name: layer_ranges(by_dev.get(device_of(d.name), ()), est.n_layer_all)
              for d in est.devices}
    title = f"{Path(est.model_path).name}  n_ctx {est.cparams.n_ctx}"
    return plot_memory(est.devices, budgets, layers, title, fig)


def plot_plan(result: PlanResult, path: str | Path | None = None) -> Figure:
    """A plan's memory per device against its budgets, layer ranges labelled, predicted speed in
    the title; saved to `path` when given (what `fitplan plan --plot` draws)."""

    est = result.estimate
    # the host budget covers Host and CPU_REPACK together: drawn once, on Host
    budgets = {d.name: result.budget_of(d.name) for d in est.devices if d.name != CPU_REPACK}
    fig = plot_estimate(est, budgets)
    speed = result.prediction.decode_tokens_s
    fig.suptitle(f"{Path(est.model_path).name}  n_ctx {est.cparams.n_ctx}  decode ~{speed:.0f} tokens/s "
                 f"(predicted)\n{' '.join(flags_to_argv(result.flags))}", fontsize="medium")
    if path is not None:
        save_figure(fig, path)
    return fig
