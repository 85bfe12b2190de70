"""`fitplan plan-set FILE`: several models on one box, planned together (planner/search/set_plan.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from planner import api
from planner.cli.options import NO_INVENTORY_FLAGS, InventoryFlags, choice, with_inventory_flags
from planner.cli.report import write_html


class SetFormat(api.OptionEnum):
    """`plan-set --format`: the set plan as a table, JSON or YAML, or what serves it."""

    __option__ = "--format"
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"
    PRESET = "preset"            # llama-server --models-preset INI
    LLAMA_SWAP = "llama-swap"    # llama-swap's config.yaml


@with_inventory_flags
def plan_set_cmd(
    file: Annotated[str, typer.Argument(help="a model-set YAML file (docs/guides/model-sets.md)")],
    inventory: InventoryFlags = NO_INVENTORY_FLAGS,
    fmt: Annotated[SetFormat, choice(
        SetFormat, "--format", help="table | json | yaml (the set plan) | preset (llama-server --models-preset INI) "
        "| llama-swap (its config.yaml)")] = SetFormat.TABLE,
    output: Annotated[str | None, typer.Option(
        "-o", "--output", help="write the set plan here (JSON when the name ends in .json, else YAML)")] = None,
    llama_bin: Annotated[str | None, typer.Option(
        "--llama-bin", help="llama-swap's cmd: the directory of llama-server (default: the pinned build when "
        "built, else the name)")] = None,
    host: Annotated[str, typer.Option("--host", help="address the servers bind")] = api.LOOPBACK,
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="the router's port (preset)")] = 8080,
    html: Annotated[str | None, typer.Option(
        "--html", help="write the set plan as one self-contained HTML page (also when the set does not fit)")] = None,
) -> None:
    """Plan several models that share the devices: which stay resident, which load on demand, each placement."""
    for path, flag in ((output, "-o"), (html, "--html")):
        if path is not None:
            api.check_output_path(path, flag)
    spec = api.read_model_set(file)
    found = api.devices_report(inventory.options())
    plan = _plan_or_page(spec, found, html)
    doc = api.set_document(plan)
    if output is not None:
        text = json.dumps(doc, indent=2) + "\n" if output.endswith(".json") else yaml.safe_dump(doc, sort_keys=False)

        def write(tmp: Path) -> None:
            tmp.write_text(text, encoding="utf-8")

        api.write_atomic(output, write)
    _show(plan, doc, fmt, llama_bin, host, port)


def _plan_or_page(spec: api.ModelSet, found: api.DevicesReport, html: str | None) -> api.SetPlan:
    """plan_set(); with --html, the page is written for a plan and for a set that does not fit."""
    try:
        plan = api.plan_set_on(spec, found)
    except api.SetInfeasible as e:
        if html is not None:
            write_html(html, api.infeasible_set_html(spec.source, e))
        raise
    if html is not None:
        write_html(html, api.set_html(plan, api.set_document(plan)))
    return plan


def _show(plan: api.SetPlan, doc: dict[str, Any], fmt: str, llama_bin: str | None, host: str, port: int) -> None:
    if fmt == "preset":
        typer.echo(api.preset_ini(doc, host, port), nl=False)
    elif fmt == "llama-swap":
        typer.echo(api.llama_swap_config(doc, api.llama_server_program(llama_bin), host), nl=False)
    else:
        typer.echo(api.render(api.SetReport(plan), fmt), nl=fmt != "yaml")
