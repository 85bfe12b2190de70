"""`fitplan estimate MODEL [--devices INV.yaml | --device NAME=SIZE ...] -- <llama.cpp flags>`.

The estimator is imported inside the command: it loads numpy and gguf, which `fitplan --help`
does not need.
"""
from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.options import Format, Model
from planner.core.render import render
from planner.hardware.inventory_yaml import inventory_from_options


def estimate_cmd(
    ctx: typer.Context,
    model: Model,
    fmt: Format = "table",
    devices: Annotated[str | None, typer.Option("--devices", help="inventory YAML")] = None,
    device: Annotated[list[str] | None, typer.Option("--device", help="CUDA0=24GiB, ...@host:port")] = None,
) -> None:
    """Per-device model, context and compute memory llama.cpp would allocate for the flags after `--`."""
    from planner.memory.estimate import estimate

    typer.echo(render(estimate(model, list(ctx.args), inventory_from_options(devices, device or [], None)), fmt))
