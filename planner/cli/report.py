"""`fitplan report PLAN.yaml -o plan.html`: the plan as one self-contained HTML page (also written by
`fitplan plan --html`)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from planner import api


def write_html(path: str, html: str) -> None:
    """The page, written whole or not at all (a reader never sees half a report)."""

    def write(tmp: Path) -> None:
        tmp.write_text(html, encoding="utf-8")

    api.write_atomic(path, write)


def report_cmd(
    plan: Annotated[str, typer.Argument(help="a plan file from `fitplan plan -o plan.yaml`")],
    output: Annotated[str, typer.Option("-o", "--output", help="the HTML file to write")],
) -> None:
    """Write the plan as one HTML page: memory per device against budgets, the layer map, speeds,
    the commands, the why-list and what would fit; no network needed to view it."""
    api.check_output_path(output)
    write_html(output, api.report_page(plan))
