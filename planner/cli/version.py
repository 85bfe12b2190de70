"""`fitplan --version`: fitplan's version and the llama.cpp whose rules it matches (DESIGN.md's pin)."""
from __future__ import annotations

import importlib.metadata
from typing import Annotated

import typer

from planner import api


def version_text() -> str:
    try:
        mine = importlib.metadata.version("fitplan")
    except importlib.metadata.PackageNotFoundError:   # run from a checkout that was never installed
        mine = "unknown (not installed)"
    return f"fitplan {mine}\nllama.cpp: {api.LLAMA_CPP_PIN}"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit()


Version = Annotated[bool, typer.Option(
    "--version", callback=_show_version, is_eager=True, help="print fitplan's version and the pinned llama.cpp")]
