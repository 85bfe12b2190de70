"""`fitplan plan`: options in, one `plan()` call, one rendering out.

The planning library (and matplotlib for --plot) is imported inside the functions that call it:
it loads numpy and gguf, which `fitplan --help` does not need.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from planner.cli.devices import DevicesReport, devices_report
from planner.cli.options import NO_INVENTORY_FLAGS, InventoryFlags, Model, with_inventory_flags
from planner.cli.report import write_html
from planner.core.errors import BadInput, InfeasiblePlacement
from planner.core.render import render
from planner.core.units import quote
from planner.system.files import check_output_path, write_atomic

if TYPE_CHECKING:
    from planner.search.result import PlanRequest, PlanResult
    from planner.search.solve import Objective


def _ctx(text: str | None) -> tuple[int | None, bool]:
    if text is None:
        return None, False
    if text.lower() == "max":
        return None, True
    try:
        value = int(text)
    except ValueError:
        raise BadInput(f"--ctx {text!r}: expected a number of tokens or 'max'") from None
    if value <= 0:
        raise BadInput(f"--ctx {text!r}: expected a positive number of tokens or 'max'")
    return value, False


def _cache(text: str, flag: str = "--draft-cache-type") -> str:
    from planner.model.costs import CACHE_TYPES

    if text.strip().lower() not in CACHE_TYPES:
        raise BadInput(f"{flag} {quote(text)}: expected one of {', '.join(CACHE_TYPES)}")
    return text.strip().lower()


def _cache_types(text: str) -> tuple[str, ...]:
    """--cache-type f16,q8_0: each one a type llama.cpp's -ctk takes, at least one, none empty."""
    items = text.split(",")
    if not text.strip() or any(not item.strip() for item in items):
        raise BadInput(f"--cache-type {quote(text)}: expected KV cache types separated by commas, e.g. f16,q8_0")
    return tuple(_cache(item, "--cache-type") for item in items)


def _objective(text: str) -> Objective:
    from planner.search.solve import Objective

    try:
        return Objective(text.lower())
    except ValueError:
        raise BadInput(f"--objective {text!r}: expected one of {', '.join(o.value for o in Objective)}") from None


def _write_deployment(output: str, result: PlanResult, doc: dict[str, Any] | None) -> None:
    """-o: the deployment document, as JSON when the name ends in .json, else as YAML."""
    from planner.emit.document import deployment_yaml

    text = json.dumps(doc, indent=2) + "\n" if output.endswith(".json") else deployment_yaml(result, doc)

    def write(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")

    write_atomic(output, write)


def _check_outputs(paths: tuple[tuple[str | None, str], ...]) -> None:
    """Refuse a bad -o, --plot or --html before any work, so that none is left written without the rest."""
    for path, flag in paths:
        if path is not None:
            check_output_path(path, flag)


FORMATS = ("table", "flags", "command", "args", "yaml", "json")
VERDICT_FORMATS = ("table", "command", "yaml", "json")


def _show(result: PlanResult, fmt: str, doc: dict[str, Any] | None, nul: bool) -> None:
    """--format: `flags`, `command`, `args` and `yaml` (the deployment document) are not views of
    PlanResult's to_dict, so they bypass render(). `args` is the argument vector one per line (NUL
    after each with -0), for `xargs -0 llama-server` or `readarray -t`."""
    from planner.emit.document import deployment_yaml
    from planner.search.result import llama_argv, plan_argv, server_command

    if fmt == "flags":
        typer.echo(shlex.join(llama_argv(result)))
    elif fmt == "command":
        typer.echo(server_command(result))
    elif fmt == "args":
        argv = plan_argv(result)
        if any("\n" in a for a in argv) and not nul:
            raise BadInput("--format args: an argument holds a newline; use -0")
        typer.echo("".join(a + ("\0" if nul else "\n") for a in argv), nl=False)
    elif fmt == "yaml":
        typer.echo(deployment_yaml(result, doc), nl=False)
    else:
        typer.echo(render(result, fmt))


def _plan_or_report(model: str, found: DevicesReport, request: PlanRequest, with_explain: bool,
                    html: str | None) -> PlanResult:
    """plan(); with --html, the page is written for a plan and for a verdict that nothing fits."""
    from planner.emit.plan_report import infeasible_report, plan_report
    from planner.emit.plan_report_html import render_html
    from planner.search.search import plan

    try:
        result = plan(model, found.inventory, request, budgets=found.budgets, with_explain=with_explain,
                      what_would_fit=True)
    except InfeasiblePlacement as e:
        if html is not None:
            write_html(html, render_html(infeasible_report(model, found.budgets, e)))
        raise
    if html is not None:
        write_html(html, render_html(plan_report(result)))
    return result


def _check_verdict(verdict: bool, clients: int | None, fmt: str, outputs: tuple[str | None, ...],
                   parallel: int) -> None:
    """--clients only with --verdict; the verdict's formats; none of one plan's outputs, and no -np
    (the verdict gives each endpoint its slots)."""
    if not verdict:
        if clients is not None:
            raise BadInput("--clients: only with --verdict")
        return
    if fmt not in VERDICT_FORMATS:
        raise BadInput(f"--verdict --format {fmt}: expected one of {', '.join(VERDICT_FORMATS)}")
    if any(o is not None for o in outputs):
        raise BadInput("--verdict prints the arrangements; -o, --plot and --html are for one plan")
    if parallel != 1:
        raise BadInput("--verdict gives each endpoint its slots from --clients; leave out --parallel")


def _show_verdict(model: str, found: DevicesReport, request: PlanRequest, clients: int, with_explain: bool,
                  fmt: str) -> None:
    """--verdict: the arrangements ranked (planner/search/verdict.py); `command` prints the winner's
    llama-server lines; --explain adds the arithmetic."""
    from planner.search.verdict import verdict

    result = verdict(model, found.inventory, found.budgets, request, clients)
    if not with_explain:
        result = replace(result, explain=())
    typer.echo("\n".join(result.commands()) if fmt == "command" else render(result, fmt))


@with_inventory_flags
def plan_cmd(
    model: Model,
    inventory: InventoryFlags = NO_INVENTORY_FLAGS,
    ctx: Annotated[str | None, typer.Option(
        "--ctx", "-c", help="context tokens, or 'max' (default: training context)")] = None,
    allow_ctx_above_train: Annotated[bool, typer.Option(
        "--allow-ctx-above-train", help="--ctx max may go past the model's training context (RoPE scaling)")] = False,
    parallel: Annotated[int, typer.Option("--parallel", "-np", help="parallel sequences (slots)")] = 1,
    objective: Annotated[str, typer.Option("--objective", help="throughput | context | balance")] = "throughput",
    cache_type: Annotated[str, typer.Option(
        "--cache-type", help="KV cache types to try in order, e.g. f16,q8_0")] = "f16",
    ubatch: Annotated[int | None, typer.Option(
        "--ubatch-size", "-ub", help="llama.cpp -ub (default: 512, or smaller when that fits more)")] = None,
    flash_attn: Annotated[str, typer.Option("--flash-attn", "-fa", help="on | off | auto")] = "auto",
    solver: Annotated[str, typer.Option("--solver", help="dp (default) | milp (PuLP/CBC, slower)")] = "dp",
    no_expert_offload: Annotated[bool, typer.Option(
        "--no-expert-offload", help="never keep MoE experts on the host")] = False,
    op_offload: Annotated[str, typer.Option(
        "--op-offload", help="auto (choose) | on | off (llama.cpp --no-op-offload)")] = "auto",
    fmt: Annotated[str, typer.Option("--format", help="table | command (the llama-server line) | args (one "
                                     "argument per line) | flags | yaml | json")] = "table",
    nul: Annotated[bool, typer.Option("-0", "--null", help="--format args: end each argument with NUL")] = False,
    output: Annotated[str | None, typer.Option("-o", "--output", help="write the YAML deployment file here")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="say what binds on each device")] = False,
    plot: Annotated[str | None, typer.Option("--plot", help="draw memory per device into this PNG")] = None,
    html: Annotated[str | None, typer.Option(
        "--html", help="write the plan as one self-contained HTML page (also when nothing fits)")] = None,
    draft: Annotated[str | None, typer.Option(
        "--draft", help="a drafter GGUF for speculative decoding (llama.cpp -md), placed with the target")] = None,
    draft_device: Annotated[str | None, typer.Option(
        "--draft-device", help="the drafter's device, or 'none' for host memory (default: the planner "
        "chooses; first the device with the target's last layers)")] = None,
    draft_cache_type: Annotated[str, typer.Option("--draft-cache-type", help="the drafter's KV cache type")] = "f16",
    draft_max: Annotated[int, typer.Option("--draft-max", help="tokens drafted per step (--spec-draft-n-max)")] = 3,
    mtp: Annotated[bool, typer.Option(
        "--mtp", help="draft with the model's own next-token-prediction block (--spec-type draft-mtp, no -md): "
        "its context is sized with the target; --draft-cache-type and --draft-max apply")] = False,
    mmproj: Annotated[str | None, typer.Option(
        "--mmproj", help="a multimodal projector GGUF (llama.cpp -mm), placed with the target")] = None,
    mmproj_device: Annotated[str | None, typer.Option(
        "--mmproj-device", help="the projector's device, or 'none' (--no-mmproj-offload); default: the "
        "planner chooses")] = None,
    lora: Annotated[list[str] | None, typer.Option("--lora", help="a LoRA adapter GGUF (repeatable)")] = None,
    verdict: Annotated[bool, typer.Option(
        "--verdict", help="rank one endpoint per device, one split and the fastest device + host offload for "
        "--clients streams and for one (seed 003 §7); --ctx is each client's context")] = False,
    clients: Annotated[int | None, typer.Option(
        "--clients", help="--verdict: concurrent streams (llama-server -np slots; default 1)")] = None,
) -> None:
    """The best llama.cpp placement under per-device budgets: flags, table, deployment file."""
    from planner.emit.document import deployment
    from planner.search.result import Companions, PlanRequest
    from planner.search.solve import Solver

    if solver not in {s.value for s in Solver}:
        raise BadInput(f"--solver {solver!r}: expected dp or milp")
    if fmt not in FORMATS:
        raise BadInput(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if nul and fmt != "args":
        raise BadInput("-0: only with --format args")
    n_ctx, max_ctx = _ctx(ctx)
    if plot:
        from planner.sweeps.plots import require_matplotlib

        require_matplotlib()   # before any work: exit 2 with the install hint
    if op_offload not in ("auto", "on", "off"):
        raise BadInput(f"--op-offload {op_offload!r}: expected auto, on or off")
    if parallel < 1 or (ubatch is not None and ubatch < 1):
        raise BadInput("--parallel and --ubatch-size take positive numbers")
    _check_outputs(((output, "-o"), (plot, "--plot"), (html, "--html")))
    _check_verdict(verdict, clients, fmt, (output, plot, html), parallel)
    # llama-cli is asked for its device list only when the plan is for this machine as it is
    report = devices_report(inventory.options())
    request = PlanRequest(n_ctx=n_ctx, max_ctx=max_ctx, n_parallel=parallel, objective=_objective(objective),
                          cache_types=_cache_types(cache_type),
                          n_ubatch=ubatch, flash_attn=flash_attn, allow_expert_offload=not no_expert_offload,
                          solver=Solver(solver), op_offload=None if op_offload == "auto" else op_offload == "on",
                          allow_ctx_above_train=allow_ctx_above_train,
                          companions=Companions(draft=draft, draft_device=draft_device,
                                                draft_cache_type=_cache(draft_cache_type), draft_max=draft_max,
                                                mmproj=mmproj, mmproj_device=mmproj_device,
                                                loras=tuple(lora or ()), mtp=mtp))
    if verdict:
        _show_verdict(model, report, request, clients or 1, explain, fmt)
        return
    result = _plan_or_report(model, report, request, explain, html)
    if plot is not None:
        from planner.sweeps.plots import plot_plan

        plot_plan(result, plot)
    doc = deployment(result) if output is not None or fmt == "yaml" else None
    if output is not None:
        _write_deployment(output, result, doc)
    _show(result, fmt, doc, nul)
