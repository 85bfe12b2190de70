"""`fitplan inspect MODEL`: per-layer weights, KV cache and recurrent state of a model.

(Not named inspect.py, which would shadow the standard library's `inspect` wherever this folder
is on sys.path.)
"""
from __future__ import annotations

from typing import Annotated

import typer

from planner import api
from planner.cli.options import Format, Model, OutputFormat


def inspect_cmd(
    model: Model,
    fmt: Format = OutputFormat.TABLE,
    ctk: Annotated[str, typer.Option("-ctk", "--cache-type-k", help="K cache type")] = "f16",
    ctv: Annotated[str, typer.Option("-ctv", "--cache-type-v", help="V cache type")] = "f16",
) -> None:
    """Per-layer weights, KV per 1k tokens and recurrent state of a model."""
    typer.echo(api.render(api.inspect(model, ctk, ctv), fmt))
