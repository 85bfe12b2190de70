"""`fitplan plan-set FILE`: several models on one box, planned together (planner/search/set_plan.py).

The planning library is imported inside the command: it loads numpy and gguf, which `fitplan --help`
does not need.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml

from planner.cli.devices import DevicesReport, devices_report
from planner.cli.options import NO_INVENTORY_FLAGS, InventoryFlags, with_inventory_flags
from planner.cli.report import write_html
from planner.core.errors import BadInput
from planner.core.render import render
from planner.system.files import check_output_path, write_atomic
from planner.system.llama_tools import LOOPBACK, tools_dir

if TYPE_CHECKING:
    from planner.search.set_input import ModelSet
    from planner.search.set_plan import SetPlan

FORMATS = ("table", "json", "yaml", "preset", "llama-swap")


@with_inventory_flags
def plan_set_cmd(
    file: Annotated[str, typer.Argument(help="a model-set YAML file (docs/guides/model-sets.md)")],
    inventory: InventoryFlags = NO_INVENTORY_FLAGS,
    fmt: Annotated[str, typer.Option("--format", help="table | json | yaml (the set plan) | preset (llama-server "
                                     "--models-preset INI) | llama-swap (its config.yaml)")] = "table",
    output: Annotated[str | None, typer.Option(
        "-o", "--output", help="write the set plan here (JSON when the name ends in .json, else YAML)")] = None,
    llama_bin: Annotated[str | None, typer.Option(
        "--llama-bin", help="llama-swap's cmd: the directory of llama-server (default: the pinned build when "
        "built, else the name)")] = None,
    host: Annotated[str, typer.Option("--host", help="address the servers bind")] = LOOPBACK,
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="the router's port (preset)")] = 8080,
    html: Annotated[str | None, typer.Option(
        "--html", help="write the set plan as one self-contained HTML page (also when the set does not fit)")] = None,
) -> None:
    """Plan several models that share the devices: which stay resident, which load on demand, each placement."""
    from planner.emit.set_document import set_document
    from planner.search.set_input import read_model_set

    if fmt not in FORMATS:
        raise BadInput(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    for path, flag in ((output, "-o"), (html, "--html")):
        if path is not None:
            check_output_path(path, flag)
    spec = read_model_set(file)
    found = devices_report(inventory.options())
    plan = _plan_or_page(spec, found, html)
    doc = set_document(plan)
    if output is not None:
        text = json.dumps(doc, indent=2) + "\n" if output.endswith(".json") else yaml.safe_dump(doc, sort_keys=False)

        def write(tmp: Path) -> None:
            tmp.write_text(text, encoding="utf-8")

        write_atomic(output, write)
    _show(plan, doc, fmt, llama_bin, host, port)


def _plan_or_page(spec: ModelSet, found: DevicesReport, html: str | None) -> SetPlan:
    """plan_set(); with --html, the page is written for a plan and for a set that does not fit."""
    from planner.emit.set_document import set_document
    from planner.emit.set_report_html import infeasible_set_html, set_html
    from planner.search.set_plan import plan_set
    from planner.search.set_suggest import SetInfeasible

    try:
        plan = plan_set(spec, found.inventory, found.budgets)
    except SetInfeasible as e:
        if html is not None:
            write_html(html, infeasible_set_html(spec.source, e))
        raise
    if html is not None:
        write_html(html, set_html(plan, set_document(plan)))
    return plan


def _show(plan: SetPlan, doc: dict[str, Any], fmt: str, llama_bin: str | None, host: str, port: int) -> None:
    from planner.emit.set_document import SetReport
    from planner.emit.set_exports import llama_swap_config, preset_ini
    from planner.llama.commands import LLAMA_SERVER

    if fmt == "preset":
        typer.echo(preset_ini(doc, host, port), nl=False)
    elif fmt == "llama-swap":
        bin_dir = Path(llama_bin) if llama_bin else tools_dir()
        program = str((bin_dir / LLAMA_SERVER).absolute()) if bin_dir else LLAMA_SERVER
        typer.echo(llama_swap_config(doc, program, host), nl=False)
    else:
        typer.echo(render(SetReport(plan), fmt), nl=fmt != "yaml")
