"""Values shared by sd-fit's planners: the problem (`FitInput`) and the answer (`Placement`).

A component computes on `compute` (GPU names; empty = the CPU) and keeps its parameters
at `params`: on its compute device(s) (RESIDENT), in CPU RAM, on another GPU, or on disk
(seed 002, "Automatic placement").
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from planner.hardware.budgets import host_budget
from planner.sd.components import CURVE, FALLBACK, Component
from planner.sd.roles import Kind


class Where(enum.Enum):
    """Where a component's parameters live, in seed 002's order of preference."""

    RESIDENT = "resident"
    CPU = "cpu"
    OTHER_GPU = "other-gpu"
    DISK = "disk"


@dataclass(frozen=True)
class GpuBudget:
    name: str
    free_bytes: int
    budget_bytes: int
    description: str = ""
    discrete: bool = True  # auto-fit enumerates discrete GPUs only (backend_fit.cpp)
    backend: str = ""  # the ggml backend registry (a row split needs one registry)


@dataclass(frozen=True)
class MappedFile:
    """A model file sd-cli maps with --mmap: its full size and the components it holds."""

    size_bytes: int
    kinds: frozenset[Kind]


@dataclass(frozen=True)
class FitInput:
    """Everything a planner needs.

    `compute[kind]` is None when no --backend assignment names the component's module
    (auto-fit chooses), () for the CPU, or the explicit GPU list. `ram_budget_bytes` is None
    when available RAM is unknown (seed 002: then RAM residency is skipped).
    """

    components: tuple[Component, ...]
    gpus: tuple[GpuBudget, ...]
    ram_free_bytes: int | None
    ram_budget_bytes: int | None
    compute: tuple[tuple[Kind, tuple[str, ...] | None], ...]
    # --mmap: each model file's size and the components it holds (empty without --mmap)
    mapped_files: tuple[MappedFile, ...] = ()

    def compute_of(self, kind: Kind) -> tuple[str, ...] | None:
        return dict(self.compute).get(kind)

    @property
    def present(self) -> tuple[Component, ...]:
        """Components with weights, in priority order (diffusion, te, vae)."""
        return tuple(sorted((c for c in self.components if c.params_bytes > 0), key=lambda c: c.kind))


@dataclass(frozen=True)
class Placement:
    kind: Kind
    params_bytes: int
    reserve_bytes: int
    compute: tuple[str, ...]  # GPU names; () = CPU
    params: Where
    params_device: str | None = None  # the GPU for Where.OTHER_GPU
    compute_mode: str = ""  # the modes its compute buffer is sd-cli's figure for; "" = seed 002's fixed reserve
    compute_origin: str = ""  # "simulated" or "sd-cli curve" (planner/sd/components.py Component.compute_origin)

    @property
    def compute_source(self) -> str:
        """Where the compute figure comes from and for which modes: "simulated, fa=on,conv_direct=off"
        (runtime/sd), "sd-cli curve, ..." (fitted through sd-cli's recorded figures) or "fixed reserve"; where
        the compute device refuses a node of the graph, that sd-cli runs it through its CPU fallback."""
        if self.compute_origin == FALLBACK:
            return (f"{FALLBACK}: {self.compute_name} refuses nodes of this graph, sd-cli computes them on the host "
                    "(CPU backend); not modelled, fixed reserve")
        return f"{self.compute_origin or CURVE}, {self.compute_mode}" if self.compute_mode else "fixed reserve"

    @property
    def compute_name(self) -> str:
        return "&".join(self.compute) if self.compute else "cpu"

    @property
    def params_name(self) -> str:
        """The --params-backend token for this placement."""
        if self.params is Where.RESIDENT:
            return self.compute_name
        if self.params is Where.OTHER_GPU:
            return str(self.params_device)
        return self.params.value

    def stored_on(self, device: str) -> bool:
        """Whether this component's full weights occupy `device` (all listed GPUs count the
        full size: seed 002 says auto-fit counts the full component on each listed GPU)."""
        if self.params is Where.RESIDENT:
            return device in self.compute
        return self.params is Where.OTHER_GPU and self.params_device == device


def ram_budget(ram_free_bytes: int | None) -> int | None:
    """Seed 002: RAM residency reserves the larger of 2 GiB or 10% of available RAM."""
    return None if ram_free_bytes is None else host_budget(ram_free_bytes, None)
