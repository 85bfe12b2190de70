"""`fitplan serve PLAN.yaml [--llama-bin DIR] [--host H] [--port P] [--dry-run] [--force] [-- extra flags]`.

The library (planner/running/serve.py) is imported inside the command: it loads numpy, gguf and
the runtime, which `fitplan --help` does not need.
"""
from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from planner.cli.options import NO_INVENTORY_FLAGS, InventoryFlags, with_inventory_flags
from planner.core.errors import BadInput
from planner.core.render import render
from planner.system.llama_tools import LOOPBACK, ToolsError, ensure_tools, tools_dir

if TYPE_CHECKING:
    from planner.running.serve import MemoryCheck


@with_inventory_flags
def serve_cmd(
    ctx: typer.Context,
    plan: Annotated[str, typer.Argument(help="a plan file from `fitplan plan -o plan.yaml`")],
    llama_bin: Annotated[str | None, typer.Option(
        "--llama-bin", help="directory of llama-server (default: the pinned build, built once if missing)")] = None,
    host: Annotated[str, typer.Option("--host", help="address llama-server binds")] = LOOPBACK,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="port (0: a free one)")] = 8080,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="print the llama-server command (shell-quoted), compare no hardware, exit")] = False,
    force: Annotated[bool, typer.Option("--force", help="run a plan made for other hardware")] = False,
    log_file: Annotated[str | None, typer.Option("--log", help="llama-server's log (default: a temp file)")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | json | yaml (the memory checks)")] = "table",
    inventory: InventoryFlags = NO_INVENTORY_FLAGS,
) -> None:
    """Start llama-server with a plan on this machine and check what it allocates against the plan.

    A set plan (`fitplan plan-set -o`) starts llama-server in router mode with the set's preset instead,
    and checks what each model instance allocates against its plan.

    Flags after `--` go to llama-server; those that change memory (-c, -np, -ub, -ctk/-ctv, -ngl, -ts,
    -ot, ...) are re-estimated and refused if the plan no longer fits its budgets. Ctrl-C or SIGTERM
    stops the server; its memory breakdown is then compared too. The inventory options describe this
    machine for the comparison with the plan's hardware (default: detected); --max-vram/--max-ram
    replace the plan's budgets.
    """
    from planner.emit.set_document import is_set_plan
    from planner.running.serve import ServeRequest, prepare_serve, run_serve, with_program

    bin_dir = Path(llama_bin) if llama_bin else tools_dir()
    if llama_bin and not (Path(llama_bin) / "llama-server").is_file():
        raise BadInput(f"--llama-bin {llama_bin}: no llama-server there")
    if is_set_plan(plan):   # a set plan (`fitplan plan-set -o`): the router serves it
        unused = (("--force", force), ("--devices", inventory.devices), ("--device", inventory.device),
                  ("--ram", inventory.ram), ("--rpc", inventory.rpc), ("--max-vram", inventory.max_vram),
                  ("--max-ram", inventory.max_ram))
        serve_set_cmd(plan, tuple(ctx.args), bin_dir, host, port, dry_run, fmt, log_file,
                      [name for name, value in unused if value])
        return
    here = replace(inventory, max_vram=None, max_ram=None).options().inventory(detect=False)
    req = ServeRequest(plan, tuple(ctx.args), host, port, bin_dir, force, check_hardware=not dry_run, here=here,
                       max_vram=inventory.max_vram, max_ram=inventory.max_ram)
    prepared = prepare_serve(req)   # refusals come before a build of the tools
    if not dry_run and bin_dir is None:
        prepared = with_program(prepared, ensure_tools())
    if dry_run:
        typer.echo(shlex.join(prepared.argv))
        return

    def ready(pid: int, check: MemoryCheck) -> None:
        typer.echo(f"fitplan: llama-server (pid {pid}) serves {prepared.url}; Ctrl-C stops it")
        typer.echo(render(check, fmt), nl=fmt != "table")

    result = run_serve(prepared, ready, Path(log_file) if log_file else None)
    if result.load is None:
        typer.echo(f"fitplan: llama-server stopped before it was ready (log {result.log_path})")
    elif result.shutdown is not None:
        typer.echo(render(result.shutdown, fmt), nl=fmt != "table")
    else:
        typer.echo(f"fitplan: llama-server printed no memory breakdown as it stopped (log {result.log_path})")
    if result.load is not None and result.returncode not in (0, -2, -15):
        raise ToolsError(f"llama-server exited with {result.returncode} (log {result.log_path})")
    if not result.fits:
        raise typer.Exit(1)


def serve_set_cmd(plan: str, extra: tuple[str, ...], bin_dir: Path | None, host: str, port: int, dry_run: bool,
                  fmt: str, log_file: str | None, unused: list[str]) -> None:
    """`serve` of a set plan: the router on the set's preset (planner/running/serve_set.py). `unused`:
    the options given that a set plan does not take (its devices and budgets are its plan's)."""
    import json
    import tempfile

    from planner.emit.set_document import read_set_plan
    from planner.running.serve_set import InstanceCheck, check_table, prepare_router, serve_set

    if extra:
        raise BadInput("a set plan's llama-server flags are its preset's: plan the set again to change them")
    if unused:
        raise BadInput(f"{', '.join(unused)}: a set plan is served as planned; plan the set again "
                       "(fitplan plan-set) for other devices or budgets")
    doc = read_set_plan(plan)
    workdir = Path(tempfile.mkdtemp(prefix="fitplan-serve-set-"))   # kept: the preset and the log are the user's
    if dry_run:
        typer.echo(shlex.join(prepare_router(doc, bin_dir, host, port or 8080, workdir)))
        return

    def show(checks: list[InstanceCheck]) -> None:
        if fmt == "json":
            typer.echo(json.dumps([c.to_dict() for c in checks], indent=2))
        else:
            typer.echo(check_table(checks))

    def ready(pid: int, url: str, checks: list[InstanceCheck]) -> None:
        typer.echo(f"fitplan: llama-server router (pid {pid}) serves {url}; Ctrl-C stops it (preset in {workdir}, "
                   f"log {log_path})")
        show(checks)

    log_path = Path(log_file) if log_file else workdir / "router.log"
    checks = serve_set(doc, bin_dir or ensure_tools(), host, port, workdir, ready, log_path)
    show(checks)
    if not all(c.matches for c in checks):
        raise typer.Exit(1)
