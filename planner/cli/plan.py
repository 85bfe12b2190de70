"""`fitplan plan`: options in, one `plan()` call, one rendering out."""
from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from planner import api
from planner.cli.options import NO_INVENTORY_FLAGS, InventoryFlags, Model, choice, with_inventory_flags
from planner.cli.report import write_html


def _write_deployment(output: str, result: api.PlanResult, doc: dict[str, Any] | None) -> None:
    """-o: the deployment document, as JSON when the name ends in .json, else as YAML."""
    text = json.dumps(doc, indent=2) + "\n" if output.endswith(".json") else api.deployment_yaml(result, doc)

    def write(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")

    api.write_atomic(output, write)


def _check_outputs(paths: tuple[tuple[str | None, str], ...]) -> None:
    """Refuse a bad -o, --plot or --html before any work, so that none is left written without the rest."""
    for path, flag in paths:
        if path is not None:
            api.check_output_path(path, flag)


class PlanFormat(api.OptionEnum):
    """`plan --format`: the table, the flags, the llama-server line, its arguments one per line, the
    deployment document (yaml) or the plan as JSON."""

    __option__ = "--format"
    TABLE = "table"
    FLAGS = "flags"
    COMMAND = "command"
    ARGS = "args"
    YAML = "yaml"
    JSON = "json"


VERDICT_FORMATS = (PlanFormat.TABLE, PlanFormat.COMMAND, PlanFormat.YAML, PlanFormat.JSON)


def _show(result: api.PlanResult, fmt: str, doc: dict[str, Any] | None, nul: bool) -> None:
    """--format: `flags`, `command`, `args` and `yaml` (the deployment document) are not views of
    PlanResult's to_dict, so they bypass render(). `args` is the argument vector one per line (NUL
    after each with -0), for `xargs -0 llama-server` or `readarray -t`."""
    if fmt == "flags":
        typer.echo(shlex.join(api.llama_argv(result)))
    elif fmt == "command":
        typer.echo(api.server_command(result))
    elif fmt == "args":
        argv = api.plan_argv(result)
        if any("\n" in a for a in argv) and not nul:
            raise api.BadInput("--format args: an argument holds a newline; use -0")
        typer.echo("".join(a + ("\0" if nul else "\n") for a in argv), nl=False)
    elif fmt == "yaml":
        typer.echo(api.deployment_yaml(result, doc), nl=False)
    else:
        typer.echo(api.render(result, fmt))


def _plan_or_report(model: str, found: api.DevicesReport, request: api.PlanRequest, with_explain: bool,
                    html: str | None) -> api.PlanResult:
    """plan(); with --html, the page is written for a plan and for a verdict that nothing fits."""
    try:
        result = api.plan_on(model, found, request, with_explain)
    except api.InfeasiblePlacement as e:
        if html is not None:
            write_html(html, api.infeasible_page(model, found, e))
        raise
    if html is not None:
        write_html(html, api.plan_page(result))
    return result


def _check_verdict(verdict: bool, clients: int | None, fmt: str, outputs: tuple[str | None, ...],
                   parallel: int) -> None:
    """--clients only with --verdict; the verdict's formats; none of one plan's outputs, and no -np
    (the verdict gives each endpoint its slots)."""
    if not verdict:
        if clients is not None:
            raise api.BadInput("--clients: only with --verdict")
        return
    if fmt not in VERDICT_FORMATS:
        raise api.BadInput(f"--verdict --format {fmt}: expected one of {', '.join(map(str, VERDICT_FORMATS))}")
    if any(o is not None for o in outputs):
        raise api.BadInput("--verdict prints the arrangements; -o, --plot and --html are for one plan")
    if parallel != 1:
        raise api.BadInput("--verdict gives each endpoint its slots from --clients; leave out --parallel")


def _show_verdict(model: str, found: api.DevicesReport, request: api.PlanRequest, clients: int, with_explain: bool,
                  fmt: str) -> None:
    """--verdict: the arrangements ranked (planner/search/verdict.py); `command` prints the winner's
    llama-server lines; --explain adds the arithmetic."""
    result = api.verdict_on(model, found, request, clients)
    if not with_explain:
        result = replace(result, explain=())
    typer.echo("\n".join(result.commands()) if fmt == "command" else api.render(result, fmt))


@with_inventory_flags
def plan_cmd(
    model: Model,
    inventory: InventoryFlags = NO_INVENTORY_FLAGS,
    ctx: Annotated[str | None, typer.Option(
        "--ctx", "-c", help="context tokens, or 'max' (default: training context)")] = None,
    allow_ctx_above_train: Annotated[bool, typer.Option(
        "--allow-ctx-above-train", help="--ctx max may go past the model's training context (RoPE scaling)")] = False,
    parallel: Annotated[int, typer.Option("--parallel", "-np", help="parallel sequences (slots)")] = 1,
    objective: Annotated[api.Objective, choice(
        api.Objective, "--objective", help="throughput | context | balance")] = api.Objective.THROUGHPUT,
    cache_type: Annotated[str, typer.Option(
        "--cache-type", help="KV cache types to try in order, e.g. f16,q8_0")] = "f16",
    ubatch: Annotated[int | None, typer.Option(
        "--ubatch-size", "-ub", help="llama.cpp -ub (default: 512, or smaller when that fits more)")] = None,
    flash_attn: Annotated[str, typer.Option("--flash-attn", "-fa", help="on | off | auto")] = "auto",
    solver: Annotated[api.Solver, choice(
        api.Solver, "--solver", help="dp (default) | milp (PuLP/CBC, slower)")] = api.Solver.DP,
    no_expert_offload: Annotated[bool, typer.Option(
        "--no-expert-offload", help="never keep MoE experts on the host")] = False,
    op_offload: Annotated[api.OpOffload, choice(
        api.OpOffload, "--op-offload", help="auto (choose) | on | off (llama.cpp --no-op-offload)",
    )] = api.OpOffload.AUTO,
    fmt: Annotated[PlanFormat, choice(PlanFormat, "--format", help="table | command (the llama-server line) | args "
                                      "(one argument per line) | flags | yaml | json")] = PlanFormat.TABLE,
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
    if nul and fmt != "args":
        raise api.BadInput("-0: only with --format args")
    request = api.plan_request(
        ctx, n_parallel=parallel, objective=objective, cache_type=cache_type, n_ubatch=ubatch, flash_attn=flash_attn,
        allow_expert_offload=not no_expert_offload, solver=solver, op_offload=op_offload,
        allow_ctx_above_train=allow_ctx_above_train,
        companions=api.Companions(draft=draft, draft_device=draft_device,
                                  draft_cache_type=api.parse_cache_type(draft_cache_type), draft_max=draft_max,
                                  mmproj=mmproj, mmproj_device=mmproj_device, loras=tuple(lora or ()), mtp=mtp))
    if plot:
        api.require_matplotlib()   # before any work: exit 2 with the install hint
    _check_outputs(((output, "-o"), (plot, "--plot"), (html, "--html")))
    _check_verdict(verdict, clients, fmt, (output, plot, html), parallel)
    # llama-cli is asked for its device list only when the plan is for this machine as it is
    report = api.devices_report(inventory.options())
    if verdict:
        _show_verdict(model, report, request, clients or 1, explain, fmt)
        return
    result = _plan_or_report(model, report, request, explain, html)
    if plot is not None:
        api.plot_plan(result, plot)
    doc = api.deployment(result) if output is not None or fmt == "yaml" else None
    if output is not None:
        _write_deployment(output, result, doc)
    _show(result, fmt, doc, nul)
