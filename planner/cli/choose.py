"""`fitplan choose MODEL...`: which file to download — a repository's quantizations (or several models)
planned for one inventory and ranked (planner/sweeps/choose.py).

A command of its own rather than an option of `plan`: `plan` answers for one file with one plan and
its outputs (`--format command|args|flags`, `--verdict`, `--plot`, companions' devices), while
`choose` takes several MODEL arguments, lists repositories and ends with a table of candidates. The
constraints are `plan`'s options under the same names; the recommended file's plan is `plan`'s.
Every output is checked before any request and written only once everything has been planned.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from planner.cli.devices import devices_report
from planner.cli.options import NO_INVENTORY_FLAGS, InventoryFlags, with_inventory_flags
from planner.cli.plan import _cache_types, _check_outputs, _ctx, _objective, _write_deployment
from planner.cli.report import write_html
from planner.core.errors import BadInput
from planner.core.render import render

if TYPE_CHECKING:
    from planner.search.result import PlanRequest

FORMATS = ("table", "json", "yaml")
SPLIT_MODES = ("auto", "layer")


def _request(ctx: str | None, clients: int, objective: str, cache_type: str, op_offload: str, split_mode: str,
             mmproj: str | None, allow_ctx_above_train: bool) -> PlanRequest:
    """The constraints as `plan` takes them; --clients N gives N slots of --ctx tokens each."""
    from planner.search.result import Companions, PlanRequest

    if clients < 1:
        raise BadInput("--clients takes a positive number")
    if op_offload not in ("auto", "on", "off"):
        raise BadInput(f"--op-offload {op_offload!r}: expected auto, on or off")
    if split_mode not in SPLIT_MODES:
        raise BadInput(f"--split-mode {split_mode!r}: expected auto (-sm tensor where it decodes faster) or layer")
    n_ctx, max_ctx = _ctx(ctx)
    return PlanRequest(n_ctx=n_ctx * clients if n_ctx else None, max_ctx=max_ctx, n_parallel=clients,
                       objective=_objective(objective), cache_types=_cache_types(cache_type),
                       op_offload=None if op_offload == "auto" else op_offload == "on", split_mode=split_mode,
                       allow_ctx_above_train=allow_ctx_above_train, companions=Companions(mmproj=mmproj))


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
    objective: Annotated[str, typer.Option("--objective", help="throughput | context | balance")] = "throughput",
    cache_type: Annotated[str, typer.Option(
        "--cache-type", help="KV cache types to try in order, e.g. f16,q8_0")] = "f16",
    op_offload: Annotated[str, typer.Option(
        "--op-offload", help="auto (choose) | on | off (llama.cpp --no-op-offload)")] = "auto",
    split_mode: Annotated[str, typer.Option(
        "--split-mode", help="auto (-sm tensor where it decodes faster) | layer")] = "auto",
    mmproj: Annotated[str | None, typer.Option(
        "--mmproj", help="plan each file with a projector: 'auto' (the repository's mmproj llama.cpp pairs "
        "with it) or a GGUF")] = None,
    include: Annotated[list[str] | None, typer.Option(
        "--include", help="only these quantizations: a quant tag or a glob on the path (repeatable)")] = None,
    max_files: Annotated[int, typer.Option(
        "--max-files", help="refuse a listing of more models than this")] = 40,
    fmt: Annotated[str, typer.Option("--format", help="table | json | yaml")] = "table",
    output: Annotated[str | None, typer.Option(
        "-o", "--output", help="write the recommended file's YAML deployment here")] = None,
    html: Annotated[str | None, typer.Option(
        "--html", help="write the comparison as one HTML page (a section per candidate)")] = None,
) -> int:
    """Which file to download: every quantization of a repository (or several models) planned for the
    devices, one table, the highest-precision file that fits and the fastest, and the plan for the first."""
    from planner.emit.document import deployment
    from planner.sweeps.choose import choose
    from planner.sweeps.choose_html import choice_html

    if fmt not in FORMATS:
        raise BadInput(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if max_files < 1:
        raise BadInput("--max-files takes a positive number")
    _check_outputs(((output, "-o"), (html, "--html")))
    request = _request(ctx, clients, objective, cache_type, op_offload, split_mode, mmproj, allow_ctx_above_train)
    report = devices_report(inventory.options())
    result = choose(models, report.inventory, report.budgets, request, tuple(include or ()), max_files)
    if html is not None:
        write_html(html, choice_html(result))
    rec = result.recommended
    if output is not None and rec is not None:
        _write_deployment(output, rec, deployment(rec))
    typer.echo(render(result, fmt), nl=fmt != "yaml")
    if rec is None:
        typer.echo("fitplan: no candidate plans under these budgets and constraints", err=True)
        return 1
    return 0
