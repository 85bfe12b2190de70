"""Weight traffic per image: the quantity `--optimal` minimises and every plan reports.

A component whose parameters live on its compute device moves nothing. An offloaded one is
copied to its compute GPU once per image when that GPU has room to cache its full weights
beside everything stored there and its compute reserve (seed 002: "CPU parameter residency
allows GPU weight caching; it does not force every weight to be copied again at every step");
otherwise once per use — every sampling step for the diffusion model.
"""
from __future__ import annotations

from planner.sd.roles import DEFAULT_STEPS, Kind
from planner.sd.sd_placement import FitInput, Placement, Where

# Relative cost of moving one byte from each location to a compute GPU. Seed 002 ranks them
# (disk worse than another GPU, worse than RAM, worse than resident); the ratios are ours: a
# peer copy crosses the host link twice, a disk reload adds storage reads (≈4x slower than a
# PCIe 4 x16 link on a fast NVMe drive) to the host copy.
TRAFFIC_WEIGHT: dict[Where, int] = {Where.RESIDENT: 0, Where.CPU: 1, Where.OTHER_GPU: 2, Where.DISK: 5}


def uses_per_image(kind: Kind, steps: int) -> int:
    return steps if kind is Kind.DIFFUSION else 1


def stored_bytes(placements: tuple[Placement, ...], device: str) -> int:
    return sum(p.params_bytes for p in placements if p.stored_on(device))


def cacheable(fit: FitInput, placements: tuple[Placement, ...], p: Placement) -> bool:
    """Whether an offloaded component's full weights fit on each of its compute GPUs."""
    budgets = {g.name: g.budget_bytes for g in fit.gpus}
    return bool(p.compute) and all(
        stored_bytes(placements, d) + p.reserve_bytes + p.params_bytes <= budgets[d] for d in p.compute)


def _copied(fit: FitInput, placements: tuple[Placement, ...], p: Placement, steps: int) -> int:
    """The bytes of `p`'s parameters copied to its compute device per image."""
    if p.params is Where.RESIDENT or (p.params is Where.CPU and not p.compute):
        return 0
    uses = 1 if cacheable(fit, placements, p) else uses_per_image(p.kind, steps)
    return p.params_bytes * uses


def traffic_bytes(fit: FitInput, placements: tuple[Placement, ...], steps: int = DEFAULT_STEPS) -> int:
    """Parameter bytes copied per image (unweighted)."""
    return sum(_copied(fit, placements, p, steps) for p in placements)


def weighted_traffic(fit: FitInput, placements: tuple[Placement, ...], steps: int = DEFAULT_STEPS) -> int:
    """Parameter bytes copied per image, each weighted by its source's TRAFFIC_WEIGHT (a disk
    reload costs more than a host copy): how sd-fit ranks explicit placements (planner/sd/ladder.py)."""
    return sum(TRAFFIC_WEIGHT[p.params] * _copied(fit, placements, p, steps) for p in placements)
