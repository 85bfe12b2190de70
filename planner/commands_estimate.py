"""`fitplan estimate MODEL [--devices INV.yaml | --device NAME=SIZE ...] -- <llama.cpp flags>`."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from planner.devices import HostSpec, Inventory
from planner.render import render

ESTIMATE_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


def _inventory(devices: str | None, device: list[str]) -> Inventory | None:
    from planner.devices import inventory_from_cli, load_inventory

    base = load_inventory(devices) if devices else None
    if device:
        # the host's RAM does not enter an estimate: an empty host stands in when none was loaded
        return inventory_from_cli(device, None, base or Inventory((), HostSpec(0, 0, 0, ""), source="--device"))
    return base


def estimate_cmd(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="GGUF path, or example:gemma3-270m")],
    fmt: Annotated[str, typer.Option("--format", help="table | json | yaml")] = "table",
    devices: Annotated[Optional[str], typer.Option("--devices", help="inventory YAML")] = None,
    device: Annotated[Optional[list[str]], typer.Option("--device", help="CUDA0=24GiB, ...@host:port")] = None,
) -> None:
    """Per-device model, context and compute memory llama.cpp would allocate for the flags after `--`."""
    from planner.estimate import estimate

    typer.echo(render(estimate(model, list(ctx.args), _inventory(devices, device or [])), fmt))
