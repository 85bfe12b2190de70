"""The `fitplan` command line: the typer app, its commands registered in one place, and `main`.

Each command module defines a plain function; FitplanError is caught once, in `main`.
"""
from __future__ import annotations

import json
import logging
import sys

import typer
import yaml

from planner import api
from planner.cli.calibrate import calibrate_cmd
from planner.cli.catalog import catalog_cmd
from planner.cli.choose import choose_cmd
from planner.cli.devices import devices_cmd
from planner.cli.estimate import estimate_cmd
from planner.cli.export import export_cmd
from planner.cli.fetch_header import fetch_header_cmd
from planner.cli.inspect_model import inspect_cmd
from planner.cli.network import root_callback
from planner.cli.options import LLAMA_FLAGS_CONTEXT
from planner.cli.plan import plan_cmd
from planner.cli.plan_set import plan_set_cmd
from planner.cli.report import report_cmd
from planner.cli.sd_fit import sd_fit_cmd
from planner.cli.serve import serve_cmd
from planner.cli.sweep import sweep_cmd
from planner.cli.validate import validate_cmd

# add_completion: --install-completion / --show-completion (typer's, for bash, zsh, fish, PowerShell)
app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Placement planner and auto-fit advisor for ggml engines.")


app.callback()(root_callback)

# `fitplan --help` lists the commands in this order.
app.command("devices")(devices_cmd)
app.command("catalog")(catalog_cmd)
app.command("sd-fit")(sd_fit_cmd)
app.command("estimate", context_settings=LLAMA_FLAGS_CONTEXT)(estimate_cmd)
app.command("sweep", context_settings=LLAMA_FLAGS_CONTEXT)(sweep_cmd)
app.command("plan")(plan_cmd)
app.command("plan-set")(plan_set_cmd)
app.command("choose")(choose_cmd)
app.command("validate", context_settings=LLAMA_FLAGS_CONTEXT)(validate_cmd)
app.command("serve", context_settings=LLAMA_FLAGS_CONTEXT)(serve_cmd)
app.command("export")(export_cmd)
app.command("calibrate")(calibrate_cmd)
app.command("report")(report_cmd)
app.command("inspect")(inspect_cmd)
app.command("fetch-header")(fetch_header_cmd)


# --format values whose errors are documents on stdout (DESIGN.md, "Contracts")
ERROR_DOCUMENT_FORMATS = ("json", "yaml")


def error_format(args: list[str]) -> str | None:
    """The --format the command line asks for, when its errors are documents (json, yaml). Read from
    the arguments themselves: an error can come while the options are still being read (a bad --ctx,
    an unknown option), before any command could record what it was asked for. Nothing after `--`
    (llama.cpp's flags) counts."""
    found = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--format" and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith("--format="):
            found = arg.split("=", 1)[1]
    return found if found in ERROR_DOCUMENT_FORMATS else None


def _print_document(e: api.FitplanError, fmt: str) -> None:
    doc = e.document()
    typer.echo(json.dumps(doc, indent=2) if fmt == "json" else yaml.safe_dump(doc, sort_keys=False), nl=fmt == "json")


def usage_line(e: typer.TyperException) -> str:
    """click's usage error as one line: the message and where help is (typer would draw a six-line box)."""
    message = e.format_message() if hasattr(e, "format_message") else str(e)
    path = getattr(getattr(e, "ctx", None), "command_path", None)
    where = f" (see '{path} --help')" if path else ""
    return " ".join(str(message).split()) + where


def main(argv: list[str] | None = None) -> int:
    """Run the CLI. fitplan's errors and click's usage errors alike are one line on stderr and, with
    --format json|yaml, a document on stdout; exit 1 infeasible, 2 bad input or usage."""
    logging.basicConfig(level=logging.WARNING, format="fitplan: %(message)s")
    args = sys.argv[1:] if argv is None else list(argv)
    fmt = error_format(args)
    try:
        # not standalone: click raises its usage errors instead of printing its own box
        rv = app(args=args, prog_name="fitplan", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except api.FitplanError as e:
        typer.echo(f"fitplan: error: {e}", err=True)
        if isinstance(e, api.InfeasiblePlacement) and e.suggestion:
            typer.echo(f"fitplan: what would fit: {e.suggestion}", err=True)
        if fmt is not None:
            _print_document(e, fmt)
        return e.exit_code
    except typer.Abort:                       # Ctrl-C or end of input at a prompt
        typer.echo("Aborted!", err=True)
        return 1
    except typer.TyperException as e:         # click's usage errors (typer's vendored click)
        if type(e).__name__ == "NoArgsIsHelpError":   # `fitplan` alone, `fitplan plan`: the help itself
            e.show()                                  # type: ignore[attr-defined]
            return int(getattr(e, "exit_code", 2))
        line = usage_line(e)
        typer.echo(f"fitplan: error: {line}", err=True)
        if fmt is not None:
            _print_document(api.UsageError(line), fmt)
        return int(getattr(e, "exit_code", 2))
    except BrokenPipeError:                   # `fitplan ... | head`: the reader left; nothing to say
        return 1
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
