"""The `fitplan` command line (top layer): thin typer commands, one library call each, through
planner.api alone (an import-linter contract); an option with a closed set of values is an enum
(planner.core.choices, or the output formats in planner/cli/options.py) that typer reads.

In: argv. Out: text on stdout (table, JSON or YAML through one renderer per result type) and
an exit code (0 success, 1 infeasible, 2 bad input); FitplanError is caught once, in `main`.
"""
from planner.cli.app import app, main

__all__ = ["app", "main"]
