"""`fitplan estimate MODEL [inventory options] -- <llama.cpp flags>`."""
from __future__ import annotations

from typing import Annotated

import typer

from planner import api
from planner.cli.options import (
    NO_INVENTORY_FLAGS,
    Format,
    InventoryFlags,
    Model,
    OutputFormat,
    choice,
    with_inventory_flags,
)

ProgramOpt = Annotated[api.Program, choice(
    api.Program, "--program",
    help="whose allocation to predict: fit-params (llama-fit-params' dry run, --fit-print on) | "
         "server (what llama-server, or llama-cli, allocates when it loads the model: one output "
         "row per slot and draft token, a real reserve)")]


@with_inventory_flags
def estimate_cmd(
    ctx: typer.Context,
    model: Model,
    fmt: Format = OutputFormat.TABLE,
    inventory: InventoryFlags = NO_INVENTORY_FLAGS,
    program: ProgramOpt = api.Program.FIT_PARAMS,
) -> None:
    """Per-device model, context and compute memory llama.cpp would allocate for the flags after `--`:
    as llama-fit-params' dry run prints it, or (--program server) as llama-server loads it
    (with --max-vram/--max-ram: checked against those budgets, exit 1 when over)."""
    est = api.estimate_on(model, inventory.options(), list(ctx.args), program)
    typer.echo(api.render(est, fmt))
    if isinstance(est, api.BudgetedEstimate) and est.over:
        raise typer.Exit(1)
