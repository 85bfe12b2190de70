"""`fitplan sweep MODEL --vary NAME=VALUES ... [-o OUT.csv] [--plot OUT.png] -- <base llama.cpp flags>`."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from planner import api
from planner.cli.options import NO_INVENTORY_FLAGS, InventoryFlags, Model, choice, with_inventory_flags


class SweepFormat(api.OptionEnum):
    """`sweep --format` (without -o): CSV, or the sweep as a table, JSON or YAML."""

    __option__ = "--format"
    CSV = "csv"
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"

PROGRESS_AFTER_S = 2.0   # show a progress bar when a sweep is predicted to take longer


class _Progress:
    """A progress bar on stderr, opened once the points so far predict a sweep longer than
    PROGRESS_AFTER_S (short sweeps print nothing)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(1)
            return
        predicted = (time.monotonic() - self.start) / done * total
        if done < total and predicted > PROGRESS_AFTER_S:
            self.bar = typer.progressbar(length=total, label="sweep", file=sys.stderr)
            self.bar.__enter__()
            self.bar.update(done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


@with_inventory_flags
def sweep_cmd(
    ctx: typer.Context,
    model: Model,
    vary: Annotated[list[str], typer.Option(
        "--vary", help="NAME=VALUES: ctx, np, ub, cache, ctk, ctv, ts, budget, memory (a device's total)")],
    inventory: InventoryFlags = NO_INVENTORY_FLAGS,
    mode: Annotated[api.SweepMode, choice(
        api.SweepMode, "--mode", help="estimate (flags as given) | plan")] = api.SweepMode.ESTIMATE,
    output: Annotated[str | None, typer.Option("-o", "--output", help="write the CSV here")] = None,
    plot: Annotated[str | None, typer.Option("--plot", help="draw the sweep into this PNG")] = None,
    fmt: Annotated[SweepFormat, choice(
        SweepFormat, "--format", help="csv | table | json | yaml (without -o)")] = SweepFormat.CSV,
) -> None:
    """Evaluate every combination of the --vary axes on the base llama.cpp flags given after `--`:
    per-device memory as CSV, optionally a plot."""
    for path, flag in ((output, "-o"), (plot, "--plot")):   # refuse before any work, so no output is left
        if path is not None:                                  # without the other
            api.check_output_path(path, flag)
    if plot is not None:
        api.require_matplotlib()
    sweep = api.sweep_on   # its first use loads the library: before the progress bar's clock starts
    progress = _Progress()
    try:
        result = sweep(model, vary, inventory.options(), list(ctx.args), mode=mode, progress=progress,
                       drawing=plot is not None)
    finally:
        progress.close()
    _emit(result, output, fmt)
    if plot is not None and isinstance(result, api.SweepResult):   # a sweep over res refuses --plot first
        api.save_figure(api.plot_sweep(result), plot)
        typer.echo(f"plot written to {plot}", err=not output)


def _emit(result: Any, output: str | None, fmt: str) -> None:
    """The sweep's CSV to `output`, else to stdout as `fmt`."""
    if output is not None:
        def write(tmp: Path) -> None:
            tmp.write_text(result.to_csv(), encoding="utf-8")

        api.write_atomic(output, write)
        typer.echo(f"{len(result.points)} points, {len(result.csv_rows())} rows written to {output}")
    elif fmt == "csv":
        typer.echo(result.to_csv(), nl=False)
    else:
        typer.echo(api.render(result, fmt))
