"""Explicit placements to try when sd-cli's own auto-fit placement does not fit.

sd-cli's auto-fit places parameters with the fixed initial compute reserves (seed 002), so at a
large image or a long video its placement can be over budget even after the VAE decode's tiling
retries, while a placement the user writes out with --params-backend fits. This module lists those
placements in the order sd-fit tries them — parameters moved to host RAM first (fewest components
moved, then least weight traffic), then to disk where RAM is short — and picks the first that fits,
or, when none does, the one that comes closest (its per-device needs are the smallest figures any
placement reaches).

An explicit --params-backend disables auto-fit (seed 002, "Automatic placement"), so the placement
found here is sd-cli's as written: compute stays where auto-fit would run each module, parameters
go where the assignment says.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from planner.sd.autofit import follow_assignments
from planner.sd.check import DeviceNeed, device_needs, overcommit, ram_need
from planner.sd.roles import Kind
from planner.sd.sd_placement import FitInput, Placement, Where
from planner.sd.traffic import weighted_traffic
from planner.sd.vae_retry import Tiling

Targets = dict[Kind, tuple[Where, str | None]]
# the placements sd-fit writes out: each component's parameters on its compute GPU, in RAM or on disk
_SPOTS = (Where.RESIDENT, Where.CPU, Where.DISK)


@dataclass(frozen=True)
class Rung:
    """One explicit placement at one decode tiling, with the sized components it was checked with."""

    fit: FitInput
    placements: tuple[Placement, ...]
    tiling: Tiling | None
    targets: Targets

    @property
    def fits(self) -> bool:
        return not overcommit(self.fit, self.placements)

    @property
    def needs(self) -> tuple[DeviceNeed, ...]:
        ram = ram_need(self.fit, self.placements)
        return device_needs(self.fit, self.placements) + ((ram,) if ram is not None else ())

    @property
    def excess(self) -> int:
        """Bytes over the caps, summed over the devices and RAM (0 when it fits)."""
        return sum(max(d.need_bytes - d.cap_bytes, 0) for d in self.needs)


def candidates(fit: FitInput) -> Iterator[list[Targets]]:
    """Groups of --params-backend assignments in the order sd-fit tries them: first those that
    keep everything off disk, by how many components they move (one, two, ...), then those that
    put one, two, ... components on disk. Within a group the one with least weight traffic wins."""
    kinds = [c.kind for c in fit.present]
    groups: dict[tuple[int, int], list[Targets]] = {}
    for spots in itertools.product(_SPOTS, repeat=len(kinds)):
        moved: Targets = {k: (w, None) for k, w in zip(kinds, spots, strict=True) if w is not Where.RESIDENT}
        if moved:
            key = (sum(w is Where.DISK for w in spots), len(moved))
            groups.setdefault(key, []).append(moved)
    for key in sorted(groups):
        yield groups[key]


def climb(sized: list[tuple[FitInput, Tiling | None]], steps: int) -> tuple[Rung | None, Rung | None]:
    """The first explicit placement that fits (None if none does) and the closest one (least bytes
    over the caps; None only when there is nothing to place). `sized`: the components at the
    asked decode, then at each of sd-cli's tiling retries (the order a decode tries them in)."""
    if not sized:
        return None, None
    closest: Rung | None = None
    for group in candidates(sized[0][0]):
        best: tuple[int, Rung] | None = None
        for targets in group:
            for fit, tiling in sized:
                rung = Rung(fit, follow_assignments(fit, targets), tiling, targets)
                if rung.fits:
                    cost = weighted_traffic(rung.fit, rung.placements, steps)
                    if best is None or cost < best[0]:
                        best = (cost, rung)
                    break
                if closest is None or rung.excess < closest.excess:
                    closest = rung
        if best is not None:
            return best[1], closest
    return None, closest
