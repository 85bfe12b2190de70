"""`fitplan devices`: the inventory a plan would use, its budgets, and the llama.cpp flags
that describe the same devices (`--rpc`, `--fit-target`, the device order).

The inventory options are planner/cli/options.py's, as every command that takes a machine has them.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import Annotated, Any

import typer

from planner.cli.options import NO_INVENTORY_FLAGS, Format, InventoryFlags, InventoryOptions, with_inventory_flags
from planner.core.render import render, table
from planner.core.units import fmt_bytes
from planner.hardware.apple import WIRED_LIMIT_SYSCTL, read_wired_limit, working_set
from planner.hardware.budgets import Budgets, fit_target_flag, fit_target_margins
from planner.hardware.inventory import DeviceSpec, Inventory, Selection, inventory_to_dict, llama_devices, rpc_flag
from planner.hardware.inventory_yaml import cpu_list_text


@dataclass(frozen=True)
class DevicesReport:
    inventory: Inventory
    budgets: Budgets

    @property
    def selection(self) -> Selection:
        """The devices llama.cpp uses without -dev (a card a second backend repeats, once)."""
        return llama_devices(self.inventory.devices)

    @property
    def llama_flags(self) -> list[str]:
        used = replace(self.inventory, devices=self.selection.devices)
        return rpc_flag(self.inventory) + fit_target_flag(fit_target_margins(used, self.budgets))

    def to_dict(self) -> dict[str, Any]:
        out = inventory_to_dict(self.inventory)
        for row in out["devices"]:
            row["budget_bytes"] = self.budgets.devices[row["name"]]
        out["host"]["budget_bytes"] = self.budgets.host_bytes
        out["uma_pool_bytes"] = self.budgets.uma_pool_bytes
        out["device_order"] = self.selection.names
        out["same_cards"] = [dict(vars(same)) for same in self.selection.same_cards]
        out["llama_flags"] = shlex.join(self.llama_flags)
        out["source"] = self.inventory.source
        for row, d in zip(out["devices"], self.inventory.devices, strict=True):
            ws = working_set(d, self.wired_limit)
            if ws is not None:
                row["working_set_bytes"], row["working_set_source"] = ws.bytes, ws.source
        return out

    @property
    def wired_limit(self) -> int | None:
        return read_wired_limit() if self.inventory.source == "detected" else None

    def to_table(self) -> str:
        def rate(n: int, unit: str, scale: float) -> str:
            return f"{n / scale:.4g} {unit}" if n else "-"

        rows = [[d.name, d.kind.value, d.backend.value, fmt_bytes(d.total_bytes), fmt_bytes(d.free_bytes),
                 fmt_bytes(self.budgets.devices[d.name]), rate(d.bandwidth_bytes_s, "GB/s", 1e9),
                 rate(d.fp16_flops, "TFLOPS", 1e12), rate(d.transfer_bytes_s, "GB/s", 1e9),
                 _where(d)]
                for d in self.inventory.devices]
        host = self.inventory.host
        rows.append(["Host", "cpu", "CPU", fmt_bytes(host.ram_total_bytes), fmt_bytes(host.ram_available_bytes),
                     fmt_bytes(self.budgets.host_bytes), rate(host.bandwidth_bytes_s, "GB/s", 1e9),
                     rate(host.fp16_flops, "TFLOPS", 1e12), "-", ""])
        lines = [table(["name", "kind", "backend", "total", "free", "budget", "bandwidth", "fp16", "link", "endpoint"],
                       rows, "lllrrrrrrl")]
        lines.append(f"CPU: {host.cpu_model or 'unknown'}")
        if self.budgets.uma_pool_bytes is not None:
            shared = ", ".join(["Host"] + [d.name for d in self.inventory.devices if d.uma])
            lines.append(f"Unified memory: {shared} share one pool of {fmt_bytes(self.budgets.uma_pool_bytes)}")
        if not self.inventory.devices:
            lines.append("No GPU or RPC devices: llama.cpp would run on the CPU only.")
        else:
            lines.append(f"llama.cpp device order: {', '.join(self.selection.names) or 'none'}")
        for same in self.selection.same_cards:
            lines.append(f"{same.skipped} is {same.used} (one card, id {same.id}): llama.cpp uses {same.used}")
        for d in self.inventory.devices:
            ws = working_set(d, self.wired_limit)
            if ws is not None:
                lines.append(f"{d.name}: Metal's budget is the GPU working set, {fmt_bytes(ws.bytes)} of "
                             f"{fmt_bytes(d.total_bytes)} ({ws.source}); when it is what binds, "
                             f"`sudo sysctl {WIRED_LIMIT_SYSCTL}=N` (MiB) raises it")
        if self.llama_flags:
            lines.append(f"llama.cpp flags: {shlex.join(self.llama_flags)}")
        return "\n".join(lines)


def devices_report(options: InventoryOptions, use_llama: bool = True) -> DevicesReport:
    """The inventory (a YAML file, else this machine), with shorthands applied, and its budgets."""
    choice = options.resolve(detect=True, use_llama=use_llama)
    assert choice is not None   # detect=True always gives an inventory
    return DevicesReport(choice.inventory, choice.budgets)


@with_inventory_flags
def devices_cmd(
    fmt: Format = "table",
    inventory: InventoryFlags = NO_INVENTORY_FLAGS,
    no_llama: Annotated[bool, typer.Option("--no-llama", help="do not ask llama-cli for its device list")] = False,
) -> None:
    """The devices a plan is made for (detected or described), their budgets, and llama.cpp's view."""
    report = devices_report(inventory.options(), use_llama=not no_llama)
    typer.echo(render(report, fmt))


def _where(d: DeviceSpec) -> str:
    """The endpoint column: an rpc-server's host:port (and the CPUs it computes on, when known), or "uma"."""
    if d.endpoint and d.cpus:
        return f"{d.endpoint} (cpus {cpu_list_text(d.cpus)}, {d.threads} thread{'s' * (d.threads != 1)})"
    return d.endpoint or ("uma" if d.uma else "")
