"""`fitplan fetch-header MODEL -o model.header.gguf`: a header-only copy of a model (local, a URL
or a reference), to plan with offline later."""
from __future__ import annotations

from typing import Annotated

import typer

from planner import api
from planner.cli.options import Format, Model, OutputFormat


def fetch_header_cmd(
    model: Model,
    output: Annotated[str, typer.Option("-o", "--output", help="the header-only GGUF to write")],
    fmt: Format = OutputFormat.TABLE,
) -> None:
    """Write a model's header (metadata and tensor index, no weights) as a header-only GGUF."""
    typer.echo(api.render(api.fetch_header(model, output), fmt))
