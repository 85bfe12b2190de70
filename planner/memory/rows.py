"""One model's memory rows: what llama.cpp allocates for it on each device (weights, KV, compute).

The target, a drafter (its own settings, derived by planner/llama/companions.py) and a projector
all report in these rows, so a plan's budgets see every model a process loads. Bytes inside.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from planner.core.units import pad
from planner.llama.settings import LlamaSettings


@dataclass(frozen=True)
class DeviceMemory:
    name: str
    model_bytes: int
    context_bytes: int
    compute_bytes: int
    # memory the process holds on this device outside llama.cpp's breakdown (planner/llama/overhead.py);
    # not part of total_bytes, which is the breakdown's row
    overhead_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.model_bytes + self.context_bytes + self.compute_bytes

    @property
    def held_bytes(self) -> int:
        """What the budget holds: the breakdown's row and the overhead."""
        return self.total_bytes + self.overhead_bytes


@dataclass(frozen=True)
class CompanionEstimate:
    """A model loaded beside the target: a drafter ("draft"), a projector ("mmproj") or an adapter ("lora")."""

    kind: str
    path: str
    devices: tuple[DeviceMemory, ...]     # rows named as the target's (RPC0, CUDA0, Host, ...)
    compute_model: str                    # "simulated" or "formula", as the target's
    notes: tuple[str, ...] = ()           # what llama.cpp would say about it (refusals, warnings)

    def device(self, name: str) -> DeviceMemory | None:
        return next((d for d in self.devices if d.name == name), None)


def weight_rows(settings: LlamaSettings) -> dict[str, int]:
    """Weight bytes per buffer row: each tensor's allocation, padded as its buffer type pads it."""
    slots, padded = settings.ctx.slot_by_name, settings.row_padding
    out: dict[str, int] = defaultdict(int)
    for name, row in settings.placement.tensor_buft:
        s = slots[name]
        size = settings.alloc_size(row, s.ggml_type, s.ne0, s.n_bytes) if row in padded else s.n_bytes
        out[row] += pad(size, settings.alignment[row])
    return dict(out)


def summed(groups: list[tuple[DeviceMemory, ...]]) -> tuple[DeviceMemory, ...]:
    """Rows of several models added per device name, in the order names first appear."""
    order: list[str] = []
    acc: dict[str, list[int]] = {}
    for rows in groups:
        for d in rows:
            if d.name not in acc:
                order.append(d.name)
                acc[d.name] = [0, 0, 0, 0]
            a = acc[d.name]
            a[0] += d.model_bytes
            a[1] += d.context_bytes
            a[2] += d.compute_bytes
            a[3] += d.overhead_bytes   # the process's, carried by the target's rows (a companion's are 0)
    return tuple(DeviceMemory(n, *acc[n]) for n in order)
