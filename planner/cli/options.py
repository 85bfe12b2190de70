"""What the commands share: option types whose help reads the same in every command, the one set of
inventory options (`--devices`, `--device`, `--ram`, `--rpc`, `--max-vram`, `--max-ram`), the
decorator that declares them on a command, what they resolve to, and the click context that hands
llama.cpp flags after `--` to the command untouched.

Detection (psutil) and llama.cpp's row names (numpy, gguf) are imported inside the methods that
use them: `fitplan --help` needs neither.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Annotated, Any, TypeVar, get_type_hints

import typer

from planner.core.errors import BadInput, InventoryError
from planner.hardware.budgets import Budgets, resolve_budgets
from planner.hardware.inventory import HostSpec, Inventory
from planner.hardware.inventory_yaml import inventory_from_cli, load_inventory

Format = Annotated[str, typer.Option("--format", help="table | json | yaml")]
Model = Annotated[str, typer.Argument(
    help="GGUF path or http(s) URL; hf://ORG/REPO[:QUANT]\\[@REV], ORG/REPO[:QUANT], hf://ORG/REPO/FILE.gguf, "
         "ms://ORG/REPO[:QUANT], ollama://NAME[:TAG]; or example:gemma3-270m")]

# The inventory options, declared once: every command that takes a machine takes these six.
AUTO = "auto"
DevicesOpt = Annotated[str | None, typer.Option(
    "--devices", help="inventory YAML, or 'auto' to detect this machine")]
DeviceOpt = Annotated[list[str] | None, typer.Option(
    "--device", help="a device, repeatable: CUDA0=24GiB, CUDA0=rtx3090, 2xrtx3090, ...@host:port")]
Ram = Annotated[str | None, typer.Option("--ram", help="host RAM, e.g. 64GiB")]
RpcOpt = Annotated[str | None, typer.Option(
    "--rpc", help="rpc-server endpoints host:port,...: their devices, as the pinned llama-cli lists them")]
MaxVramOpt = Annotated[str | None, typer.Option(
    "--max-vram", help="budgets: 6 | CUDA0=6,CUDA1=-2 | gpu=512MiB (GiB; negative: free minus)")]
MaxRamOpt = Annotated[str | None, typer.Option(
    "--max-ram", help="host RAM budget (default: available - max(2GiB, 10%))")]

_F = TypeVar("_F", bound=Callable[..., Any])

# click: unknown options and extra arguments (the llama.cpp flags) land in ctx.args
LLAMA_FLAGS_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


@dataclass(frozen=True)
class InventoryChoice:
    """The devices a command works with and their budgets."""

    inventory: Inventory
    budgets: Budgets

    def budget_rows(self) -> dict[str, int]:
        """Device name -> budget bytes, and the host's under Host when its RAM is known."""
        from planner.llama.placement import HOST  # loads numpy and gguf: not at `fitplan --help`

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
        endpoints = tuple(e.strip() for e in rpc.split(",") if e.strip()) if rpc else ()
        if rpc is not None and not endpoints:
            raise InventoryError("--rpc: expected host:port[,host:port...]")
        return cls(devices, tuple(device or ()), ram, endpoints, max_vram, max_ram)

    @property
    def yaml_path(self) -> str | None:
        return self.devices if self.devices not in (None, AUTO) else None

    def llama_argv(self, argv: list[str]) -> list[str]:
        """llama.cpp flags with `--rpc` added for the `--rpc` endpoints when the flags name none
        (llama.cpp uses an rpc-server only when its --rpc names it)."""
        if not self.rpc or any(a in ("--rpc", "-rpc") or a.startswith("--rpc=") for a in argv):
            return argv
        return ["--rpc", ",".join(self.rpc), *argv]

    def inventory(self, detect: bool, use_llama: bool = True) -> Inventory | None:
        """The inventory: the YAML file, else this machine when `detect` (or `--devices auto`, or
        `--rpc`) asks for it, else none; `--device` and `--ram` applied on top (to an empty host
        when there is no base). llama-cli is asked for the device list only when the devices are
        this machine's as they are (no `--device`), or for `--rpc`."""
        from planner.hardware.detect import detect_inventory

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
class InventoryFlags:
    """The six inventory options exactly as typer hands them over, parsed only when `options()` is called
    (so a command's own checks keep running first)."""

    devices: DevicesOpt = None
    device: DeviceOpt = None
    ram: Ram = None
    rpc: RpcOpt = None
    max_vram: MaxVramOpt = None
    max_ram: MaxRamOpt = None

    def options(self) -> InventoryOptions:
        return InventoryOptions.of(self.devices, self.device, self.ram, self.rpc, self.max_vram, self.max_ram)


NO_INVENTORY_FLAGS = InventoryFlags()   # the `inventory` parameter's default (typer passes the six instead)


def with_inventory_flags(command: _F) -> _F:
    """Declare the six inventory options on a typer command once: the command takes one parameter
    `inventory: InventoryFlags = NO_INVENTORY_FLAGS`, and typer sees the six options in its place
    (same order, same help)."""
    signature = inspect.signature(command, eval_str=True)
    hints = get_type_hints(InventoryFlags, include_extras=True)
    six = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
           for f in fields(InventoryFlags)]
    params: list[inspect.Parameter] = []
    for p in signature.parameters.values():
        params.extend(six if p.name == "inventory" else [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)])
    if len(params) != len(signature.parameters) + len(six) - 1:
        raise TypeError(f"{command.__name__}: expected a parameter `inventory: InventoryFlags`")

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        flags = InventoryFlags(**{f.name: kwargs.pop(f.name) for f in fields(InventoryFlags)})
        return command(inventory=flags, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params} | {"return": signature.return_annotation}
    return wrapper  # type: ignore[return-value]
