"""`fitplan estimate MODEL [inventory options] -- <llama.cpp flags>`.

The estimator is imported inside the command: it loads numpy and gguf, which `fitplan --help`
does not need.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from planner.cli.options import NO_INVENTORY_FLAGS, Format, InventoryFlags, Model, with_inventory_flags
from planner.core.render import render
from planner.core.units import fmt_mib
from planner.hardware.budgets import Budgets, pool_members
from planner.hardware.inventory import HOST as HOST_NAME

ProgramOpt = Annotated[str, typer.Option(
    "--program", help="whose allocation to predict: fit-params (llama-fit-params' dry run, --fit-print on) | "
                      "server (what llama-server, or llama-cli, allocates when it loads the model: one output "
                      "row per slot and draft token, a real reserve)")]

if TYPE_CHECKING:
    from planner.memory.estimate import Estimate


@dataclass(frozen=True)
class BudgetedEstimate:
    """An estimate checked against `--max-vram`/`--max-ram`: the estimate's own output, plus each
    budget and whether the total is within it."""

    estimate: Estimate
    budgets: dict[str, int]     # row name -> bytes
    resolved: Budgets | None = None   # where Host shares one pool with UMA devices (seed 003 §7)

    @property
    def totals(self) -> dict[str, int]:
        """Budgeted row -> bytes; the host's rows (Host, CPU_REPACK, ...) count against Host's budget, a device's
        overhead outside llama.cpp's breakdown against its own."""
        from planner.llama.placement import HOST, HOST_ROWS  # numpy and gguf: not at `fitplan --help`

        out = {d.name: d.held_bytes for d in self.estimate.devices if d.name not in HOST_ROWS}
        out[HOST] = sum(d.total_bytes for d in self.estimate.devices if d.name in HOST_ROWS)
        return {name: n for name, n in out.items() if name in self.budgets}

    @property
    def pool(self) -> tuple[str, int, int] | None:
        """The shared pool's label (Host+Vulkan0), the bytes its members use together, and its budget."""
        members = pool_members(self.resolved) if self.resolved and HOST_NAME in self.budgets else []
        if not members or self.resolved is None or self.resolved.uma_pool_bytes is None:
            return None
        used = sum(n for name, n in self.totals.items() if name in members)
        return "+".join(members), used, self.resolved.uma_pool_bytes

    @property
    def over(self) -> list[str]:
        names = [name for name, n in self.totals.items() if n > self.budgets[name]]
        pool = self.pool
        return names + ([pool[0]] if pool and pool[1] > pool[2] else [])

    def to_dict(self) -> dict[str, Any]:
        out = {**self.estimate.to_dict(), "budgets": self.budgets, "fits": not self.over}
        if self.pool:
            label, used, budget = self.pool
            out["shared_pool"] = {"devices": label.split("+"), "bytes": used, "budget_bytes": budget}
        return out

    def to_table(self) -> str:
        rows = [f"{name} {fmt_mib(n)} of {fmt_mib(self.budgets[name])} MiB" for name, n in self.totals.items()]
        if self.pool:
            label, used, budget = self.pool
            rows.append(f"{label} together {fmt_mib(used)} of {fmt_mib(budget)} MiB")
        if not rows:
            return self.estimate.to_table().rstrip("\n") + "\n\nbudgets: none for these devices"
        verdict = "fits" if not self.over else "does not fit on " + ", ".join(self.over)
        return self.estimate.to_table().rstrip("\n") + "\n\nbudgets: " + "; ".join(rows) + f" ({verdict})"


@with_inventory_flags
def estimate_cmd(
    ctx: typer.Context,
    model: Model,
    fmt: Format = "table",
    inventory: InventoryFlags = NO_INVENTORY_FLAGS,
    program: ProgramOpt = "fit-params",
) -> None:
    """Per-device model, context and compute memory llama.cpp would allocate for the flags after `--`:
    as llama-fit-params' dry run prints it, or (--program server) as llama-server loads it
    (with --max-vram/--max-ram: checked against those budgets, exit 1 when over)."""
    from planner.llama.programs import parse_program
    from planner.memory.estimate import estimate

    sized_for = parse_program(program)
    options = inventory.options()
    choice = options.resolve(detect=False)
    est = estimate(model, options.llama_argv(list(ctx.args)), choice.inventory if choice else None,
                   program=sized_for)
    if choice is None or not (inventory.max_vram or inventory.max_ram):
        typer.echo(render(est, fmt))
        return
    checked = BudgetedEstimate(est, choice.budget_rows(), choice.budgets)
    typer.echo(render(checked, fmt))
    if checked.over:
        raise typer.Exit(1)
