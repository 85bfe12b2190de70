"""`fitplan inspect MODEL`: per-layer weights, KV cache and recurrent state of a model.

(Not named inspect.py, which would shadow the standard library's `inspect` wherever this folder
is on sys.path.) The library import sits inside the command: `fitplan --help` loads no numpy or gguf.
"""
from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.options import Format, Model
from planner.core.render import render


def inspect_cmd(
    model: Model,
    fmt: Format = "table",
    ctk: Annotated[str, typer.Option("-ctk", "--cache-type-k", help="K cache type")] = "f16",
    ctv: Annotated[str, typer.Option("-ctv", "--cache-type-v", help="V cache type")] = "f16",
) -> None:
    """Per-layer weights, KV per 1k tokens and recurrent state of a model."""
    from planner.model.inspect import inspect

    typer.echo(render(inspect(model, ctk, ctv), fmt))
