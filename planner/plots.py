"""Pictures of sweeps and placements (matplotlib, an optional dependency: `fitplan[plots]`).

Figures are built on `matplotlib.figure.Figure`, never through pyplot: no global backend is
chosen or changed, so the same functions draw headless in the CLI (Agg renders `savefig`) and
inline in a notebook (`display(fig)`). Every function returns the Figure it drew.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from planner.errors import BadInput
from planner.units import GiB

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from planner.estimate import Estimate
    from planner.sweep import Axis, SweepResult

# One colour per memory kind, the same in every picture.
KIND_COLOURS = {"model": "#4c72b0", "context": "#55a868", "compute": "#c44e52"}
DPI = 110


class MemoryRow(Protocol):
    name: str
    model_bytes: int
    context_bytes: int
    compute_bytes: int


def require_matplotlib() -> None:
    """Fail early with one line (exit 2) when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BadInput("plots need matplotlib: pip install 'fitplan[plots]'") from None


def _figure(width: float, height: float) -> Figure:
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def save_figure(fig: Figure, path: str | Path) -> None:
    """Save in the format the file name says (.png, .svg, .pdf)."""
    suffix = Path(path).suffix.lstrip(".").lower() or "png"
    fig.savefig(path, format=suffix, dpi=DPI)


def gib(n_bytes: float) -> float:
    return n_bytes / GiB


# --------------------------------------------------------------------------- sweeps

def _x_axis(result: SweepResult) -> Axis:
    """The first axis that takes more than one value (the user's --vary order), else the first."""
    return next((a for a in result.axes if len(a.values) > 1), result.axes[0])


def _numeric(axis: Axis) -> bool:
    return axis.spec.kind.value in ("int", "size")


def _x_positions(axis: Axis) -> dict[Any, float]:
    if not _numeric(axis):
        return {v: float(i) for i, v in enumerate(axis.values)}
    return {v: gib(v) if axis.spec.kind.value == "size" else float(v) for v in axis.values}


def _dress_x(ax: Axes, axis: Axis, pos: dict[Any, float]) -> None:
    ax.set_xlabel(axis.spec.label)
    values = sorted(pos.values())
    if not _numeric(axis):
        step = max(1, len(values) // 12)   # at most ~12 tick labels on a categorical axis
        ax.set_xticks(values[::step], [axis.text(v) for v in axis.values][::step], rotation=45, ha="right")
        return
    ratios = {b / a for a, b in zip(values, values[1:]) if a > 0}
    if axis.name == "ctx" and len(values) > 2 and ratios == {2.0}:
        ax.set_xscale("log", base=2)    # a doubling range: evenly spaced points
        ax.set_xticks(values, [f"{int(v) // 1024}k" if v >= 1024 else str(int(v)) for v in values])
        ax.minorticks_off()


def _series(result: SweepResult, x: Axis) -> dict[str, list[Any]]:
    """Points grouped by the values of the other varying axes: label -> points, in sweep order."""
    others = [(i, a) for i, a in enumerate(result.axes) if a is not x and len(a.values) > 1]
    groups: dict[str, list[Any]] = {}
    for p in result.points:
        label = ", ".join(f"{a.name}={a.text(p.settings[i])}" for i, a in others)
        groups.setdefault(label, []).append(p)
    return groups


def _budget_line(ax: Axes, points: Sequence[Any], name: str, xs: list[float]) -> None:
    budgets = [p.device(name).budget_bytes if p.device(name) else None for p in points]
    if any(b is None for b in budgets):
        return
    if len(set(budgets)) == 1:
        ax.axhline(gib(budgets[0]), color="0.3", linestyle="--", linewidth=1, label="budget")
    else:
        ax.plot(xs, [gib(b) for b in budgets], color="0.3", linestyle="--", linewidth=1, label="budget")


def plot_sweep(result: SweepResult, fig: Figure | None = None) -> Figure:
    """One panel per device: its total memory (GiB) along the first varying axis, one line per
    combination of the other varying axes; hollow markers where the point does not fit."""
    names = result.device_names
    ncols = min(3, len(names))
    nrows = -(-len(names) // ncols)
    fig = fig or _figure(4.2 * ncols, 3.4 * nrows)
    axs = fig.subplots(nrows, ncols, squeeze=False)
    x = _x_axis(result)
    xi = result.axes.index(x)
    pos = _x_positions(x)
    groups = _series(result, x)
    for k, name in enumerate(names):
        ax = axs[k // ncols][k % ncols]
        for n, (label, points) in enumerate(groups.items()):
            pts = [p for p in points if p.device(name)]
            xs = [pos[p.settings[xi]] for p in pts]
            ys = [gib(p.device(name).total_bytes) for p in pts]
            line, = ax.plot(xs, ys, marker="", label=label or "total", color=f"C{n}")
            fits = [p.device(name).fits and p.feasible for p in pts]
            ax.scatter([a for a, f in zip(xs, fits) if f], [b for b, f in zip(ys, fits) if f], color=line.get_color(),
                       s=16, zorder=3)
            ax.scatter([a for a, f in zip(xs, fits) if not f], [b for b, f in zip(ys, fits) if not f],
                       facecolors="none", edgecolors=line.get_color(), s=28, zorder=3)
            if n == 0:
                _budget_line(ax, pts, name, xs)
        ax.set_title(name if name != "Host" else "Host (RAM)")
        ax.set_ylabel("memory (GiB)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        _dress_x(ax, x, pos)
        if k == 0 and (len(groups) > 1 or ax.get_legend_handles_labels()[0]):
            ax.legend(fontsize="small")
    for k in range(len(names), nrows * ncols):
        axs[k // ncols][k % ncols].set_visible(False)
    fig.suptitle(f"{Path(result.model).name}: memory per device (hollow: over budget)", fontsize="medium")
    return fig


# --------------------------------------------------------------------------- placements

def plot_memory(rows: Sequence[MemoryRow], budgets: Mapping[str, int] | None = None,
                layers: Mapping[str, str] | None = None, title: str = "", ax: Axes | None = None) -> Figure:
    """Per-device stacked bars (model, context, compute; GiB) against each device's budget,
    the layer ranges each device holds written above its bar."""
    fig = ax.figure if ax is not None else _figure(max(4.0, 1.3 * len(rows) + 2), 4.2)
    ax = ax or fig.subplots()
    budgets, layers = budgets or {}, layers or {}
    xs = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for kind, colour in KIND_COLOURS.items():
        heights = [gib(getattr(r, f"{kind}_bytes")) for r in rows]
        ax.bar(xs, heights, bottom=bottom, color=colour, label=kind, width=0.6)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for x, r in zip(xs, rows):
        if r.name in budgets:
            ax.hlines(gib(budgets[r.name]), x - 0.4, x + 0.4, colors="k", linestyles="--", linewidth=1.2,
                      label="budget" if x == next(i for i, q in enumerate(rows) if q.name in budgets) else None)
        top = max(bottom[x], gib(budgets.get(r.name, 0)))
        if layers.get(r.name):
            ax.annotate(f"layers {layers[r.name]}", (x, top), xytext=(0, 4), textcoords="offset points",
                        ha="center", va="bottom", fontsize="small")
    ax.set_xticks(xs, [r.name for r in rows])
    ax.set_ylabel("memory (GiB)")
    ax.set_xlabel("device")
    ax.margins(y=0.15)
    ax.legend(fontsize="small", loc="upper left")
    if title:
        ax.set_title(title, fontsize="medium")
    return fig


def plot_estimate(est: Estimate, budgets: Mapping[str, int] | None = None, ax: Axes | None = None) -> Figure:
    """An estimate's memory per device, with the layers each holds (the host's are the CPU's)."""
    from planner.sweep import layer_ranges

    by_dev = dict(est.layers)
    layers = {d.name: layer_ranges(by_dev.get("CPU" if d.name == "Host" else d.name, ()), est.n_layer_all)
              for d in est.devices}
    title = f"{Path(est.model_path).name}  n_ctx {est.cparams.n_ctx}"
    return plot_memory(est.devices, budgets, layers, title, ax)
