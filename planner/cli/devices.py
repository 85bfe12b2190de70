"""`fitplan devices`: the inventory a plan would use, its budgets, and the llama.cpp flags
that describe the same devices (`--rpc`, `--fit-target`, the device order).

The inventory options are planner/cli/options.py's, as every command that takes a machine has them.
"""
from __future__ import annotations

from typing import Annotated

import typer

from planner import api
from planner.cli.options import NO_INVENTORY_FLAGS, Format, InventoryFlags, OutputFormat, with_inventory_flags


@with_inventory_flags
def devices_cmd(
    fmt: Format = OutputFormat.TABLE,
    inventory: InventoryFlags = NO_INVENTORY_FLAGS,
    no_llama: Annotated[bool, typer.Option("--no-llama", help="do not ask llama-cli for its device list")] = False,
) -> None:
    """The devices a plan is made for (detected or described), their budgets, and llama.cpp's view."""
    report = api.devices_report(inventory.options(), use_llama=not no_llama)
    typer.echo(api.render(report, fmt))
