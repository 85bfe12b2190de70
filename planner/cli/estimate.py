"""`fitplan estimate MODEL [--devices INV.yaml | --device NAME=SIZE ...] -- <llama.cpp flags>`."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from planner.hardware.inventory import inventory_from_options
from planner.core.render import render

ESTIMATE_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


def estimate_cmd(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="GGUF path, or example:gemma3-270m")],
    fmt: Annotated[str, typer.Option("--format", help="table | json | yaml")] = "table",
    devices: Annotated[Optional[str], typer.Option("--devices", help="inventory YAML")] = None,
    device: Annotated[Optional[list[str]], typer.Option("--device", help="CUDA0=24GiB, ...@host:port")] = None,
) -> None:
    """Per-device model, context and compute memory llama.cpp would allocate for the flags after `--`."""
    from planner.memory.estimate import estimate

    typer.echo(render(estimate(model, list(ctx.args), inventory_from_options(devices, device or [], None)), fmt))
