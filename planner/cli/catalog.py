"""`fitplan catalog [--kind gpu|igpu|host] [--match TEXT] [--format table|json|yaml]`: the entries of
configs/catalog.yaml, each with the document its figures come from (planner/hardware/catalog.py)."""
from __future__ import annotations

from typing import Annotated

import typer

from planner import api
from planner.cli.options import Format, OutputFormat

KindOpt = Annotated[str | None, typer.Option(
    "--kind", help=f"only entries of this kind: {api.one_of(api.CATALOG_KINDS)}")]
MatchOpt = Annotated[str | None, typer.Option("--match", help="only ids or descriptions containing this text")]


def catalog_cmd(kind: KindOpt = None, match: MatchOpt = None, fmt: Format = OutputFormat.TABLE) -> None:
    """The hardware catalog: ids for --device (CUDA0=rtx3060, 2xrtx3090) and `catalog:` in an
    inventory, with memory, bandwidth, fp16 throughput and each entry's source; empty where the
    source gives no figure."""
    typer.echo(api.render(api.list_catalog(kind, match), fmt))
