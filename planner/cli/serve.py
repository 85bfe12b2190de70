"""`fitplan serve PLAN.yaml [--llama-bin DIR] [--host H] [--port P] [--dry-run] [--force] [-- extra flags]`."""
from __future__ import annotations

import json
import shlex
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from planner import api
from planner.cli.options import NO_INVENTORY_FLAGS, InventoryFlags, OutputFormat, choice, with_inventory_flags


@with_inventory_flags
def serve_cmd(
    ctx: typer.Context,
    plan: Annotated[str, typer.Argument(help="a plan file from `fitplan plan -o plan.yaml`")],
    llama_bin: Annotated[str | None, typer.Option(
        "--llama-bin", help="directory of llama-server (default: the pinned build, built once if missing)")] = None,
    host: Annotated[str, typer.Option("--host", help="address llama-server binds")] = api.LOOPBACK,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="port (0: a free one)")] = 8080,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="print the llama-server command (shell-quoted), compare no hardware, exit")] = False,
    force: Annotated[bool, typer.Option("--force", help="run a plan made for other hardware")] = False,
    log_file: Annotated[str | None, typer.Option("--log", help="llama-server's log (default: a temp file)")] = None,
    fmt: Annotated[OutputFormat, choice(
        OutputFormat, "--format", help="table | json | yaml (the memory checks)")] = OutputFormat.TABLE,
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
    bin_dir = Path(llama_bin) if llama_bin else api.tools_dir()
    if llama_bin and not (Path(llama_bin) / "llama-server").is_file():
        raise api.BadInput(f"--llama-bin {llama_bin}: no llama-server there")
    if api.is_set_plan(plan):   # a set plan (`fitplan plan-set -o`): the router serves it
        unused = (("--force", force), ("--devices", inventory.devices), ("--device", inventory.device),
                  ("--ram", inventory.ram), ("--rpc", inventory.rpc), ("--max-vram", inventory.max_vram),
                  ("--max-ram", inventory.max_ram))
        serve_set_cmd(plan, tuple(ctx.args), bin_dir, host, port, dry_run, fmt, log_file,
                      [name for name, value in unused if value])
        return
    here = replace(inventory, max_vram=None, max_ram=None).options().inventory(detect=False)
    req = api.ServeRequest(plan, tuple(ctx.args), host, port, bin_dir, force, check_hardware=not dry_run, here=here,
                       max_vram=inventory.max_vram, max_ram=inventory.max_ram)
    prepared = api.prepare_serve(req)   # refusals come before a build of the tools
    if not dry_run and bin_dir is None:
        prepared = api.with_program(prepared, api.ensure_tools())
    if dry_run:
        typer.echo(shlex.join(prepared.argv))
        return

    def ready(pid: int, check: api.MemoryCheck) -> None:
        typer.echo(f"fitplan: llama-server (pid {pid}) serves {prepared.url}; Ctrl-C stops it")
        typer.echo(api.render(check, fmt), nl=fmt != "table")

    result = api.run_serve(prepared, ready, Path(log_file) if log_file else None)
    if result.load is None:
        typer.echo(f"fitplan: llama-server stopped before it was ready (log {result.log_path})")
    elif result.shutdown is not None:
        typer.echo(api.render(result.shutdown, fmt), nl=fmt != "table")
    else:
        typer.echo(f"fitplan: llama-server printed no memory breakdown as it stopped (log {result.log_path})")
    if result.load is not None and result.returncode not in (0, -2, -15):
        raise api.ToolsError(f"llama-server exited with {result.returncode} (log {result.log_path})")
    if not result.fits:
        raise typer.Exit(1)


def serve_set_cmd(plan: str, extra: tuple[str, ...], bin_dir: Path | None, host: str, port: int, dry_run: bool,
                  fmt: str, log_file: str | None, unused: list[str]) -> None:
    """`serve` of a set plan: the router on the set's preset (planner/running/serve_set.py). `unused`:
    the options given that a set plan does not take (its devices and budgets are its plan's)."""
    if extra:
        raise api.BadInput("a set plan's llama-server flags are its preset's: plan the set again to change them")
    if unused:
        raise api.BadInput(f"{', '.join(unused)}: a set plan is served as planned; plan the set again "
                       "(fitplan plan-set) for other devices or budgets")
    doc = api.read_set_plan(plan)
    workdir = Path(tempfile.mkdtemp(prefix="fitplan-serve-set-"))   # kept: the preset and the log are the user's
    if dry_run:
        typer.echo(shlex.join(api.prepare_router(doc, bin_dir, host, port or 8080, workdir)))
        return

    def show(checks: list[api.InstanceCheck]) -> None:
        if fmt == "json":
            typer.echo(json.dumps([c.to_dict() for c in checks], indent=2))
        else:
            typer.echo(api.check_table(checks))

    def ready(pid: int, url: str, checks: list[api.InstanceCheck]) -> None:
        typer.echo(f"fitplan: llama-server router (pid {pid}) serves {url}; Ctrl-C stops it (preset in {workdir}, "
                   f"log {log_path})")
        show(checks)

    log_path = Path(log_file) if log_file else workdir / "router.log"
    checks = api.serve_set(doc, bin_dir or api.ensure_tools(), host, port, workdir, ready, log_path)
    show(checks)
    if not all(c.matches for c in checks):
        raise typer.Exit(1)
