"""`fitplan validate (PLAN.yaml | MODEL [inventory options] -- <llama.cpp flags>)
[--engine embedded|llama.cpp] [--kernels default|ggml-avx2] [--reserve-only]`."""
from __future__ import annotations

from typing import Annotated

import typer

from planner import api
from planner.cli.options import NO_INVENTORY_FLAGS, Format, InventoryFlags, OutputFormat, choice, with_inventory_flags


@with_inventory_flags
def validate_cmd(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="a plan file (plan.yaml), or a GGUF path / example:gemma3-270m")],
    engine: Annotated[api.Engine, choice(api.Engine, "--engine", help="embedded | llama.cpp")] = api.Engine.EMBEDDED,
    kernels: Annotated[str, typer.Option("--kernels", help="embedded engine: default | ggml-avx2 (bit-exact "
                                          "with llama.cpp's portable x86-64 build, slower)")] = "default",
    fmt: Format = OutputFormat.TABLE,
    inventory: InventoryFlags = NO_INVENTORY_FLAGS,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", min=1, help="prompt length in token ids")] = 32,
    gen_tokens: Annotated[int, typer.Option("--gen-tokens", min=1, help="generated tokens")] = 16,
    reserve_only: Annotated[bool, typer.Option(
        "--reserve-only", help="split and allocate the reserve graphs under the budgets, compute nothing")] = False,
) -> None:
    """Run the model under a plan or flags; measured memory, splits and speed against the estimate
    (the inventory options are for the MODEL form: a plan file carries its own)."""
    report = api.validate_on(target, inventory.options(), list(ctx.args), prompt_tokens, gen_tokens, engine, kernels,
                             reserve_only)
    typer.echo(api.render(report, fmt), nl=fmt != "table")
    if not report.fits:
        raise typer.Exit(1)
