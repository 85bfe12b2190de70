"""`fitplan sweep MODEL --vary NAME=VALUES ... [-o OUT.csv] [--plot OUT.png] -- <base llama.cpp flags>`.

The sweep library, the llama.cpp flag parser and matplotlib are imported inside the command: they
load numpy and gguf, which `fitplan --help` does not need.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from planner.cli.options import NO_INVENTORY_FLAGS, InventoryFlags, Model, with_inventory_flags
from planner.core.errors import BadInput
from planner.core.render import render
from planner.system.files import check_output_path, write_atomic

FORMATS = ("csv", "table", "json", "yaml")
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
    mode: Annotated[str, typer.Option("--mode", help="estimate (flags as given) | plan")] = "estimate",
    output: Annotated[str | None, typer.Option("-o", "--output", help="write the CSV here")] = None,
    plot: Annotated[str | None, typer.Option("--plot", help="draw the sweep into this PNG")] = None,
    fmt: Annotated[str, typer.Option("--format", help="csv | table | json | yaml (without -o)")] = "csv",
) -> None:
    """Evaluate every combination of the --vary axes on the base llama.cpp flags given after `--`:
    per-device memory as CSV, optionally a plot."""
    from planner.llama.flags import parse_llama_flags
    from planner.sweeps.sweep import parse_vary, sweep

    if fmt not in FORMATS:
        raise BadInput(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    for path, flag in ((output, "-o"), (plot, "--plot")):   # refuse before any work, so no output is left
        if path is not None:                                  # without the other
            check_output_path(path, flag)
    if plot is not None:
        from planner.sweeps.plots import require_matplotlib

        require_matplotlib()
    axes = [parse_vary(v) for v in vary]
    options = inventory.options()
    args = options.llama_argv(list(ctx.args))
    base = parse_llama_flags(args) if args else None
    progress = _Progress()
    try:
        choice = options.resolve(detect=False)
        result = sweep(model, axes, choice.inventory if choice else None, base, mode=mode, progress=progress,
                       max_vram=inventory.max_vram, max_ram=inventory.max_ram)
    finally:
        progress.close()
    if output is not None:
        def write(tmp: Path) -> None:
            tmp.write_text(result.to_csv(), encoding="utf-8")

        write_atomic(output, write)
        typer.echo(f"{len(result.points)} points, {len(result.csv_rows())} rows written to {output}")
    elif fmt == "csv":
        typer.echo(result.to_csv(), nl=False)
    else:
        typer.echo(render(result, fmt))
    if plot is not None:
        from planner.sweeps.plots import plot_sweep, save_figure

        save_figure(plot_sweep(result), plot)
        typer.echo(f"plot written to {plot}", err=not output)
