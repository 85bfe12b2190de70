"""`fitplan choose MODEL...`: which file to download — a repository's quantizations (or several models)
planned for one inventory and ranked (planner/sweeps/choose.py).

A command of its own rather than an option of `plan`: `plan` answers for one file with one plan and
its outputs (`--format command|args|flags`, `--verdict`, `--plot`, companions' devices), while
`choose` takes several MODEL arguments, lists repositories and ends with a table of candidates. The
constraints are `plan`'s options under the same names; the recommended file's plan is `plan`'s.
Every output is checked before any request and written only once everything has been planned.
"""
from __future__ import annotations

from typing import Annotated

import typer

from planner import api
from planner.cli.options import NO_INVENTORY_FLAGS, Format, InventoryFlags, OutputFormat, choice, with_inventory_flags
from planner.cli.plan import _check_outputs, _write_deployment
from planner.cli.report import write_html


@with_inventory_flags
def choose_cmd(
    models: Annotated[list[str], typer.Argument(
        help="repositories (hf://ORG/REPO, ORG/REPO, ms://ORG/REPO: every quantization), ollama://NAME (every "
             "tag), or single models as `plan` takes them; several are compared together")],
    inventory: InventoryFlags = NO_INVENTORY_FLAGS,
    ctx: Annotated[str | None, typer.Option(
        "--ctx", "-c", help="context tokens each file must fit (each client's, with --clients), or 'max' "
        "(default: the training context)")] = None,
    allow_ctx_above_train: Annotated[bool, typer.Option(
        "--allow-ctx-above-train", help="--ctx max may go past the model's training context")] = False,
    clients: Annotated[int, typer.Option(
        "--clients", help="concurrent streams: llama-server -np slots, each with --ctx tokens")] = 1,
    objective: Annotated[api.Objective, choice(
        api.Objective, "--objective", help="throughput | context | balance")] = api.Objective.THROUGHPUT,
    cache_type: Annotated[str, typer.Option(
        "--cache-type", help="KV cache types to try in order, e.g. f16,q8_0")] = "f16",
    op_offload: Annotated[api.OpOffload, choice(
        api.OpOffload, "--op-offload", help="auto (choose) | on | off (llama.cpp --no-op-offload)",
    )] = api.OpOffload.AUTO,
    split_mode: Annotated[api.SplitMode, choice(
        api.SplitMode, "--split-mode", help="auto (-sm tensor where it decodes faster) | layer")] = api.SplitMode.AUTO,
    mmproj: Annotated[str | None, typer.Option(
        "--mmproj", help="plan each file with a projector: 'auto' (the repository's mmproj llama.cpp pairs "
        "with it) or a GGUF")] = None,
    include: Annotated[list[str] | None, typer.Option(
        "--include", help="only these quantizations: a quant tag or a glob on the path (repeatable)")] = None,
    max_files: Annotated[int, typer.Option(
        "--max-files", help="refuse a listing of more models than this")] = 40,
    fmt: Format = OutputFormat.TABLE,
    output: Annotated[str | None, typer.Option(
        "-o", "--output", help="write the recommended file's YAML deployment here")] = None,
    html: Annotated[str | None, typer.Option(
        "--html", help="write the comparison as one HTML page (a section per candidate)")] = None,
) -> int:
    """Which file to download: every quantization of a repository (or several models) planned for the
    devices, one table, the highest-precision file that fits and the fastest, and the plan for the first."""
    if max_files < 1:
        raise api.BadInput("--max-files takes a positive number")
    _check_outputs(((output, "-o"), (html, "--html")))
    request = api.choose_request(ctx, clients, objective, cache_type, op_offload, split_mode, mmproj,
                                 allow_ctx_above_train)
    report = api.devices_report(inventory.options())
    result = api.choose_on(models, report, request, include or (), max_files)
    if html is not None:
        write_html(html, api.choice_html(result))
    rec = result.recommended
    if output is not None and rec is not None:
        _write_deployment(output, rec, api.deployment(rec))
    typer.echo(api.render(result, fmt), nl=fmt != "yaml")
    if rec is None:
        typer.echo("fitplan: no candidate plans under these budgets and constraints", err=True)
        return 1
    return 0
