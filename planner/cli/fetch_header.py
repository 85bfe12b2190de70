"""`fitplan fetch-header MODEL -o model.header.gguf`: a header-only copy of a model (local, a URL
or a reference), to plan with offline later. The library imports sit inside the command."""
from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.options import Format, Model
from planner.core.render import render


def fetch_header_cmd(
    model: Model,
    output: Annotated[str, typer.Option("-o", "--output", help="the header-only GGUF to write")],
    fmt: Format = "table",
) -> None:
    """Write a model's header (metadata and tensor index, no weights) as a header-only GGUF."""
    from planner.gguf.header_file import write_header_file
    from planner.registry.examples import resolve_model

    typer.echo(render(write_header_file(resolve_model(model), output), fmt))
