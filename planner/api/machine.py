"""The machine a command works with: the six inventory options resolved to an inventory and its
budgets, the devices report (`fitplan devices`), and the network settings the global options give.

Loaded with the command line itself: nothing here reads numpy or gguf.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner.core.errors import BadInput, InventoryError
from planner.core.render import table
from planner.core.units import fmt_bytes
from planner.hardware.apple import WIRED_LIMIT_SYSCTL, read_wired_limit, working_set
from planner.hardware.budgets import Budgets, fit_target_flag, fit_target_margins, resolve_budgets
from planner.hardware.detect import detect_inventory
from planner.hardware.inventory import (
    HOST,
    DeviceSpec,
    HostSpec,
    Inventory,
    Selection,
    inventory_to_dict,
    llama_devices,
    rpc_flag,
)
from planner.hardware.inventory_yaml import cpu_list_text, inventory_from_cli, load_inventory
from planner.system import net

AUTO = "auto"   # --devices auto: detect this machine


def rpc_endpoints(rpc: str | None) -> tuple[str, ...]:
    """--rpc host:port,...: the endpoints (none when the option is not given)."""
    endpoints = tuple(e.strip() for e in rpc.split(",") if e.strip()) if rpc else ()
    if rpc is not None and not endpoints:
        raise InventoryError("--rpc: expected host:port[,host:port...]")
    return endpoints


@dataclass(frozen=True)
class InventoryChoice:
    """The devices a command works with and their budgets."""

    inventory: Inventory
    budgets: Budgets

    def budget_rows(self) -> dict[str, int]:
        """Device name -> budget bytes, and the host's under Host when its RAM is known."""
        host = {HOST: self.budgets.host_bytes} if self.inventory.host.ram_available_bytes else {}
        return {**self.budgets.devices, **host}


@dataclass(frozen=True)
class InventoryOptions:
    """The six inventory options as given on the command line."""

    devices: str | None = None        # a YAML path, or AUTO
    device: tuple[str, ...] = ()
    ram: str | None = None
    rpc: tuple[str, ...] = ()         # endpoints
    max_vram: str | None = None
    max_ram: str | None = None

    @classmethod
    def of(cls, devices: str | None, device: list[str] | None, ram: str | None, rpc: str | None,
           max_vram: str | None, max_ram: str | None) -> InventoryOptions:
        return cls(devices, tuple(device or ()), ram, rpc_endpoints(rpc), max_vram, max_ram)

    @property
    def yaml_path(self) -> str | None:
        return self.devices if self.devices not in (None, AUTO) else None

    def llama_argv(self, argv: list[str]) -> list[str]:
        """llama.cpp flags with `--rpc` added for the `--rpc` endpoints when the flags name none
        (llama.cpp uses an rpc-server only when its --rpc names it)."""
        from planner.llama.flags import arg, spellings  # loads gguf and numpy: not at `fitplan --help`

        given = spellings("rpc")
        if not self.rpc or any(a in given or a.split("=", 1)[0] in given for a in argv):
            return argv
        return [*arg("rpc", ",".join(self.rpc)), *argv]

    def inventory(self, detect: bool, use_llama: bool = True) -> Inventory | None:
        """The inventory: the YAML file, else this machine when `detect` (or `--devices auto`, or
        `--rpc`) asks for it, else none; `--device` and `--ram` applied on top (to an empty host
        when there is no base). llama-cli is asked for the device list only when the devices are
        this machine's as they are (no `--device`), or for `--rpc`."""
        if self.yaml_path and self.rpc:
            raise InventoryError("--rpc: expected either --devices (describe RPC hosts in the YAML) or --rpc, not both")
        if self.yaml_path:
            base: Inventory | None = load_inventory(self.yaml_path)
        elif detect or self.devices == AUTO or self.rpc:
            base = detect_inventory(list(self.rpc), use_llama=use_llama and (not self.device or bool(self.rpc)))
        else:
            base = None
        if not self.device and not self.ram:
            return base
        return inventory_from_cli(list(self.device), self.ram,
                                  base or Inventory((), HostSpec(0, 0, 0, ""), source="--device"))

    def resolve(self, detect: bool, use_llama: bool = True) -> InventoryChoice | None:
        """The inventory and its budgets (`--max-vram`, `--max-ram`); None when there is no inventory."""
        inventory = self.inventory(detect, use_llama)
        if inventory is None:
            if self.max_vram or self.max_ram:
                raise BadInput("--max-vram/--max-ram: budgets are relative to devices; expected --devices, "
                               "--device or --rpc too")
            return None
        return InventoryChoice(inventory, resolve_budgets(inventory, self.max_vram, self.max_ram))


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
    """The inventory (a YAML file, else this machine), with shorthands applied, and its budgets
    (`fitplan devices`)."""
    choice = options.resolve(detect=True, use_llama=use_llama)
    assert choice is not None   # detect=True always gives an inventory
    return DevicesReport(choice.inventory, choice.budgets)


def _where(d: DeviceSpec) -> str:
    """The endpoint column: an rpc-server's host:port (and the CPUs it computes on, when known), or "uma"."""
    if d.endpoint and d.cpus:
        return f"{d.endpoint} (cpus {cpu_list_text(d.cpus)}, {d.threads} thread{'s' * (d.threads != 1)})"
    return d.endpoint or ("uma" if d.uma else "")


def _url(option: str, value: str | None) -> str | None:
    if value is None:
        return None
    if not value.lower().startswith(("http://", "https://")):
        raise BadInput(f"{option} {value!r}: expected an http:// or https:// URL")
    return value.rstrip("/")


def network_settings(hf_endpoint: str | None = None, ms_endpoint: str | None = None,
                     ollama_registry: str | None = None, token_file: str | None = None,
                     header_cache: str | None = None, http_timeout: float | None = None) -> net.NetSettings:
    """The current settings with the global options' choices applied (unset ones keep the environment's)."""
    if http_timeout is not None and http_timeout <= 0:
        raise BadInput(f"--http-timeout {http_timeout:g}: expected a positive number of seconds")
    return net.overridden(
        hf_endpoint=_url("--hf-endpoint", hf_endpoint), ms_endpoint=_url("--ms-endpoint", ms_endpoint),
        ollama_registry=_url("--ollama-registry", ollama_registry),
        token=net.read_token_file(token_file) if token_file else None,
        header_cache=Path(header_cache) if header_cache else None, timeout_s=http_timeout)
