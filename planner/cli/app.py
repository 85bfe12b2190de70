"""The `fitplan` command line: the typer app, its commands registered in one place, and `main`.

Each command module defines a plain function; FitplanError is caught once, in `main`.
"""
from __future__ import annotations

import logging

import typer

from planner.cli.devices import devices_cmd
from planner.cli.estimate import estimate_cmd
from planner.cli.export import export_cmd
from planner.cli.fetch_header import fetch_header_cmd
from planner.cli.inspect_model import inspect_cmd
from planner.cli.network import root_callback
from planner.cli.options import LLAMA_FLAGS_CONTEXT
from planner.cli.plan import plan_cmd
from planner.cli.sd_fit import sd_fit_cmd
from planner.cli.serve import serve_cmd
from planner.cli.sweep import sweep_cmd
from planner.cli.validate import validate_cmd
from planner.core.errors import FitplanError, InfeasiblePlacement

# add_completion: --install-completion / --show-completion (typer's, for bash, zsh, fish, PowerShell)
app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Placement planner and auto-fit advisor for ggml engines.")


app.callback()(root_callback)

# `fitplan --help` lists the commands in this order.
app.command("devices")(devices_cmd)
app.command("sd-fit")(sd_fit_cmd)
app.command("estimate", context_settings=LLAMA_FLAGS_CONTEXT)(estimate_cmd)
app.command("sweep", context_settings=LLAMA_FLAGS_CONTEXT)(sweep_cmd)
app.command("plan")(plan_cmd)
app.command("validate", context_settings=LLAMA_FLAGS_CONTEXT)(validate_cmd)
app.command("serve", context_settings=LLAMA_FLAGS_CONTEXT)(serve_cmd)
app.command("export")(export_cmd)
app.command("inspect")(inspect_cmd)
app.command("fetch-header")(fetch_header_cmd)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; click reports usage errors itself (exit 2), fitplan's errors are one line."""
    logging.basicConfig(level=logging.WARNING, format="fitplan: %(message)s")
    try:
        app(args=argv, prog_name="fitplan")
    except FitplanError as e:
        typer.echo(f"fitplan: error: {e}", err=True)
        if isinstance(e, InfeasiblePlacement) and e.suggestion:
            typer.echo(f"fitplan: what would fit: {e.suggestion}", err=True)
        return e.exit_code
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0
