"""What the commands share: option types whose help reads the same in every command, the output formats,
the declaration of an option whose values are an enum (`choice`), the one set of
inventory options (`--devices`, `--device`, `--ram`, `--rpc`, `--max-vram`, `--max-ram`), the
decorator that declares them on a command, and the click context that hands llama.cpp flags after
`--` to the command untouched. What the six resolve to is the library's (planner.api.InventoryOptions).
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Annotated, Any, TypeVar, get_type_hints

import typer

from planner import api


def choice(values: type[api.OptionEnum], *names: str, help: str) -> Any:   # noqa: A002 (typer's own keyword)
    """An option whose values are an enum's: the enum reads what is given (in any case) and refuses
    anything else with one line naming the choices, exit 2 (planner/core/choices.py); --help lists them."""
    return typer.Option(*names, parser=values, metavar="[" + "|".join(m.value for m in values) + "]", help=help)


class OutputFormat(api.OptionEnum):
    __option__ = "--format"
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


Format = Annotated[OutputFormat, choice(OutputFormat, "--format", help="table | json | yaml")]
Model = Annotated[str, typer.Argument(
    help="GGUF path or http(s) URL; hf://ORG/REPO[:QUANT]\\[@REV], ORG/REPO[:QUANT], hf://ORG/REPO/FILE.gguf, "
         "ms://ORG/REPO[:QUANT], ollama://NAME[:TAG]; or example:gemma3-270m")]

# The inventory options, declared once: every command that takes a machine takes these six.
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
class InventoryFlags:
    """The six inventory options exactly as typer hands them over, parsed only when `options()` is called
    (so a command's own checks keep running first)."""

    devices: DevicesOpt = None
    device: DeviceOpt = None
    ram: Ram = None
    rpc: RpcOpt = None
    max_vram: MaxVramOpt = None
    max_ram: MaxRamOpt = None

    def options(self) -> api.InventoryOptions:
        return api.InventoryOptions.of(self.devices, self.device, self.ram, self.rpc, self.max_vram, self.max_ram)


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
