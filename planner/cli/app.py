"""The `fitplan` command line: thin commands, one library call each, one renderer.

Each command module registers itself on `app`; FitplanError is caught once in `main`.
"""
from __future__ import annotations

import logging
import sys
from typing import Annotated, Optional

import typer

from planner.core.errors import FitplanError
from planner.core.render import render

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Placement planner and auto-fit advisor for ggml engines.")



@app.callback()
def _root() -> None:
    """Placement planner and auto-fit advisor for ggml engines."""


Format = Annotated[str, typer.Option("--format", help="table | json | yaml")]

from planner.cli.devices import devices_cmd  # noqa: E402
app.command("devices")(devices_cmd)
from planner.cli.sd_fit import sd_fit_cmd  # noqa: E402
app.command("sd-fit")(sd_fit_cmd)
from planner.cli.estimate import ESTIMATE_CONTEXT, estimate_cmd  # noqa: E402
app.command("estimate", context_settings=ESTIMATE_CONTEXT)(estimate_cmd)
from planner.cli.sweep import SWEEP_CONTEXT, sweep_cmd  # noqa: E402
app.command("sweep", context_settings=SWEEP_CONTEXT)(sweep_cmd)
from planner.cli.plan import plan_cmd  # noqa: E402
app.command("plan")(plan_cmd)
from planner.cli.validate import VALIDATE_CONTEXT, validate_cmd  # noqa: E402
app.command("validate", context_settings=VALIDATE_CONTEXT)(validate_cmd)


@app.command("inspect")
def inspect_cmd(
    model: Annotated[str, typer.Argument(help="GGUF path, or example:gemma3-270m")],
    fmt: Format = "table",
    ctk: Annotated[str, typer.Option("-ctk", "--cache-type-k", help="K cache type")] = "f16",
    ctv: Annotated[str, typer.Option("-ctv", "--cache-type-v", help="V cache type")] = "f16",
) -> None:
    """Per-layer weights, KV per 1k tokens and recurrent state of a model."""
    from planner.model.inspect import inspect

    typer.echo(render(inspect(model, ctk, ctv), fmt))


def main(argv: Optional[list[str]] = None) -> int:
    """Run the CLI; click reports usage errors itself (exit 2), fitplan's errors are one line."""
    logging.basicConfig(level=logging.WARNING, format="fitplan: %(message)s")
    try:
        app(args=argv, prog_name="fitplan")
    except FitplanError as e:
        typer.echo(f"fitplan: error: {e}", err=True)
        if getattr(e, "suggestion", ""):
            typer.echo(f"fitplan: what would fit: {e.suggestion}", err=True)
        return e.exit_code
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0

