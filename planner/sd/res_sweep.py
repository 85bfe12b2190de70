"""`fitplan sweep MODEL --vary res=512,768,1024`: sd-fit's verdict at each square image size.

Each point is one sd-fit plan (planner/sd/fit.py) at width = height = the side, with the same
devices and sd-cli flags: the verdict, and per GPU (then RAM) the weights and the largest compute
room it needs against what sd-cli's runtime checks let it hold (planner/sd/check.py).
"""
from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from planner.core.errors import BadInput
from planner.core.render import table
from planner.core.units import fmt_mib
from planner.hardware.inventory import Inventory
from planner.sd.check import DeviceNeed
from planner.sd.fit import SdFitRequest, sd_fit
from planner.sd.plan import search_limits
from planner.sd.sd_compute import CORPUS_MAX_SIDE

CSV_COLUMNS = ("res", "width", "height", "verdict", "fits", "vae_tiling", "device", "weights_bytes", "compute_bytes",
               "need_bytes", "cap_bytes", "device_fits", "flags")


@dataclass(frozen=True)
class ResPoint:
    width: int
    height: int
    verdict: str
    fits: bool
    vae_tiling: bool
    needs: tuple[DeviceNeed, ...]
    flags: str


@dataclass(frozen=True)
class ResSweep:
    model: str
    points: tuple[ResPoint, ...]

    def csv_rows(self) -> list[dict[str, Any]]:
        rows = []
        for p in self.points:
            head = {"res": p.width, "width": p.width, "height": p.height, "verdict": p.verdict, "fits": int(p.fits),
                    "vae_tiling": int(p.vae_tiling), "flags": p.flags}
            rows += [dict(head, device=d.device, weights_bytes=d.weights_bytes, compute_bytes=d.compute_bytes,
                          need_bytes=d.need_bytes, cap_bytes=d.cap_bytes, device_fits=int(d.fits)) for d in p.needs]
            if not p.needs:
                rows.append(head)
        return rows

    def to_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS), lineterminator="\n", restval="")
        writer.writeheader()
        writer.writerows(self.csv_rows())
        return buf.getvalue()

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "mode": "sd-fit", "axes": {"res": [p.width for p in self.points]},
                "points": [{"settings": {"res": p.width}, "width": p.width, "height": p.height,
                            "verdict": p.verdict, "fits": p.fits, "vae_tiling": p.vae_tiling, "flags": p.flags,
                            "devices": [{"name": d.device, "weights_bytes": d.weights_bytes,
                                         "compute_bytes": d.compute_bytes, "need_bytes": d.need_bytes,
                                         "cap_bytes": d.cap_bytes, "fits": d.fits} for d in p.needs]}
                           for p in self.points]}

    def to_table(self) -> str:
        names = list(dict.fromkeys(d.device for p in self.points for d in p.needs))
        rows = []
        for p in self.points:
            by = {d.device: d for d in p.needs}
            cells = [f"{fmt_mib(by[n].need_bytes)} / {fmt_mib(by[n].cap_bytes)}" if n in by else "" for n in names]
            rows.append([f"{p.width}x{p.height}", *cells, p.verdict])
        heads = ["res", *[f"{n} MiB" for n in names], "verdict"]
        return f"{self.model} (sd-fit)\n\n" + table(heads, rows, align="l" + "r" * len(names) + "l") + "\n"


def res_sweep(request: SdFitRequest, inventory: Inventory, sides: Sequence[int],
              progress: Callable[[int, int], None] | None = None) -> ResSweep:
    """sd-fit at each square side of `sides`, everything else as `request` asks. Where a compute figure
    comes from a curve, sides above the largest the corpus records are refused (the curves are not
    extrapolated); a model whose every figure is simulated is swept to SIMULATED_MAX_SIDE."""
    points = []
    for i, side in enumerate(sides):
        plan = sd_fit(replace(request, width=side, height=side, search_largest=False), inventory)
        max_side, _ = search_limits(p.compute_origin for p in plan.placements)
        if side > max_side:
            raise BadInput(f"--vary res={side}: " + (
                f"sd-cli's recorded compute figures end at {CORPUS_MAX_SIDE}x{CORPUS_MAX_SIDE}; sd-fit does not "
                "extrapolate beyond them" if max_side == CORPUS_MAX_SIDE else
                f"sd-fit sizes images up to {max_side}x{max_side}"))
        points.append(ResPoint(side, side, plan.verdict, not plan.warnings, plan.vae_tiling, plan.needs, plan.flags))
        if progress is not None:
            progress(i + 1, len(sides))
    return ResSweep(" ".join(s.path for s in request.sources), tuple(points))
