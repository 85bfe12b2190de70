"""The axes of `fitplan sweep`: `--vary NAME=VALUES` parsed and checked, and applied to flags.

An axis is `NAME=VALUES`; VALUES are comma-separated items, a numeric item may be a range:
  ctx=4096..131072        context (-c): a range without a step doubles (4096, 8192, ..., 131072)
  ctx=4096..16384:4096    a range with a step counts up by it (4096, 8192, 12288, 16384)
  np=1,2,4  ub=128,512    parallel slots (-np), micro-batch (-ub)
  cache=f16,q8_0          both KV cache types (-ctk and -ctv); ctk=/ctv= set one
  ts=12/7,10/9            tensor splits (-ts, written with '/' since ',' separates items)
  ts=steps                every one-layer step between two devices: 1/(L-1), 2/(L-2), ... where
                          L is the number of offloaded layers, output layer included (seed 003
                          §5: a -ts step is one layer, and non-uniform layers make each step
                          worth measuring rather than interpolating)
  budget=8,12,24GiB       VRAM budget of every device, as sd-cli's --max-vram takes it (bare
                          numbers are GiB; -2 is free minus 2 GiB); ranges of sizes work too. A
                          budget never exceeds the device's free memory: one above it is capped,
                          with a warning and the CSV's budget_capped column saying so
  memory=12,16,24GiB      total (and free) memory of every device: hypothetical hardware, a card
                          of that size in place of each device; budgets then follow from it
  res=512,768,1024        stable-diffusion.cpp models: the side of a square image (multiples of 64;
                          ranges work: 512..1024:128); sd-fit's verdict at each, the base flags after
                          `--` being sd-cli's (model files, --backend, --flash-attn, ...)
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.core.choices import SweepMode
from planner.core.errors import BadInput, FlagError
from planner.core.units import GiB, MiB, parse_size
from planner.llama.flags import LlamaFlags, arg, flags_to_argv, parse_llama_flags

TS_STEPS = "steps"
CTX_MAX = "max"   # plan mode: the largest context that fits


class AxisKind(enum.Enum):
    INT = "int"        # a whole number, ranges allowed
    SIZE = "size"      # a budget amount, ranges allowed
    WORD = "word"      # a list of words
    SPLIT = "split"    # -ts values, or `steps`


@dataclass(frozen=True)
class AxisSpec:
    kind: AxisKind
    flags: tuple[str, ...]   # the llama.cpp flags one value sets, as the flag table's keys (none for budget)
    label: str               # an axis label for plots, with the unit
    minimum: int = 0


AXES: dict[str, AxisSpec] = {
    "ctx": AxisSpec(AxisKind.INT, ("n_ctx",), "context size -c (tokens)"),
    "np": AxisSpec(AxisKind.INT, ("n_parallel",), "parallel slots -np", 1),
    "ub": AxisSpec(AxisKind.INT, ("n_ubatch",), "micro-batch -ub (tokens)", 1),
    "cache": AxisSpec(AxisKind.WORD, ("cache_type_k", "cache_type_v"), "KV cache type -ctk/-ctv"),
    "ctk": AxisSpec(AxisKind.WORD, ("cache_type_k",), "K cache type -ctk"),
    "ctv": AxisSpec(AxisKind.WORD, ("cache_type_v",), "V cache type -ctv"),
    "ts": AxisSpec(AxisKind.SPLIT, ("tensor_split",), "tensor split -ts (layers per device)"),
    "budget": AxisSpec(AxisKind.SIZE, (), "VRAM budget per device (GiB)"),
    "memory": AxisSpec(AxisKind.SIZE, (), "device memory per device (GiB)"),
    # stable-diffusion.cpp models: the side of a square image (sd-cli's -W and -H); sd-fit plans each
    "res": AxisSpec(AxisKind.INT, (), "image side -W = -H (px)", 64),
}
RES_STEP = 64   # sd-cli's image sizes are multiples of 64 (planner.sd.sd_compute.SIZE_STEP)

MODES = tuple(m.value for m in SweepMode)


@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple[Any, ...]   # int for INT, bytes (int) for SIZE, str otherwise

    @property
    def spec(self) -> AxisSpec:
        return AXES[self.name]

    def text(self, value: Any) -> str:
        return fmt_budget(value) if self.spec.kind is AxisKind.SIZE else str(value)


def fmt_budget(n_bytes: int) -> str:
    """A budget amount the way --max-vram reads it back: whole GiB or MiB when exact."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB)):
        if n_bytes % scale == 0:
            return f"{n_bytes // scale}{unit}"
    return f"{n_bytes}B"


def _number(name: str, text: str, kind: AxisKind) -> int:
    try:
        return parse_size(text) if kind is AxisKind.SIZE else int(text)
    except (BadInput, ValueError):
        expected = "a size such as 8GiB or 8" if kind is AxisKind.SIZE else "a whole number"
        raise FlagError(f"--vary {name}: expected {expected}, got {text!r}") from None


def _range(name: str, item: str, kind: AxisKind) -> list[int]:
    """`A..B` doubles from A up to B; `A..B:S` counts up by S."""
    lo_text, _, rest = item.partition("..")
    hi_text, _, step_text = rest.partition(":")
    lo, hi = _number(name, lo_text, kind), _number(name, hi_text, kind)
    step = _number(name, step_text, kind) if step_text else 0
    if hi < lo:
        raise FlagError(f"--vary {name}={item}: the range ends below its start")
    if step_text and step <= 0:
        raise FlagError(f"--vary {name}={item}: the step must be above 0")
    if not step_text and lo <= 0:
        raise FlagError(f"--vary {name}={item}: a doubling range must start above 0 (or give a step: A..B:S)")
    out, x = [], lo
    while x <= hi:
        out.append(x)
        x = x + step if step_text else x * 2
    return out


def _items(spec: str | Sequence[Any]) -> list[str]:
    if isinstance(spec, str):
        return [s.strip() for s in spec.split(",")]
    return [str(v).strip() for v in spec]


def parse_axis(name: str, spec: str | Sequence[Any]) -> Axis:
    """One `--vary NAME=VALUES` axis; every value is checked with llama.cpp's flag rules now."""
    key = name.strip().lower()
    if key not in AXES:
        raise FlagError(f"--vary {name}: unknown axis; expected one of {', '.join(AXES)}")
    kind = AXES[key].kind
    values: list[Any] = []
    for item in _items(spec):
        if not item:
            raise FlagError(f"--vary {name}: an empty value; expected values separated by ','")
        if key == "ctx" and item.lower() == CTX_MAX:
            values.append(CTX_MAX)
        elif kind in (AxisKind.INT, AxisKind.SIZE) and ".." in item:
            values += _range(key, item, kind)
        elif kind in (AxisKind.INT, AxisKind.SIZE):
            values.append(_number(key, item, kind))
        else:
            values.append(item.lower() if kind is AxisKind.WORD else item)
    axis = Axis(key, tuple(dict.fromkeys(values)))
    _check_range(axis, spec)
    for value in axis.values:
        if value in (TS_STEPS, CTX_MAX):
            continue
        apply_axes(LlamaFlags(), [(axis, value)], f"--vary {key}={axis.text(value)}")
    return axis


def _check_range(axis: Axis, spec: str | Sequence[Any]) -> None:
    """The values an axis admits beyond its kind: a device's memory above 0, image sides in steps."""
    if axis.name == "res" and any(v <= 0 or v % RES_STEP for v in axis.values):
        raise FlagError(f"--vary res: expected positive multiples of {RES_STEP} (image sides in pixels); got {spec!r}")
    if axis.name == "memory" and any(v <= 0 for v in axis.values):
        raise FlagError(f"--vary memory: expected sizes above 0 (a device's total memory); got {spec!r}")


def parse_vary(text: str) -> Axis:
    """`NAME=VALUES` as the command line writes it."""
    name, eq, values = text.partition("=")
    if not eq:
        raise FlagError(f"--vary {text!r}: expected NAME=VALUES such as ctx=4096..32768 or cache=f16,q8_0")
    return parse_axis(name, values)


def apply_axes(base: LlamaFlags, settings: Sequence[tuple[Axis, Any]], where: str = "") -> LlamaFlags:
    argv = flags_to_argv(base)
    for axis, value in settings:
        text = axis.text(value)
        for key in axis.spec.flags:
            argv += arg(key, text.replace("/", ",") if key == "tensor_split" else text)
    try:
        return parse_llama_flags(argv)
    except FlagError as e:
        raise FlagError(f"{where}: {e}" if where else str(e)) from None
