"""The calibration's fit (docs/internals/calibration.md): from measured times and the work the throughput model
says each placement did, the inverse rates by least squares. Pure: llama-bench's runs are
planner/measuring/calibrate.py's.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from planner.core.errors import FitplanError
from planner.hardware.inventory import CalibratedFigure, DeviceKind, Inventory
from planner.llama.context import ModelContext
from planner.llama.placement import CPU
from planner.model.costs import CostTable
from planner.speed.throughput import PlacementView, boundaries, decode_attention, decode_bytes, prefill_work

log = logging.getLogger(__name__)

# Work columns of attention: a device's name and one of these (device names hold no blank).
ATTENTION = " attention"                  # prefill: attention FLOPs
ATTENTION_SWEPT = " attention swept"      # decode: the cache bytes a token's query heads sweep


class CalibrationError(FitplanError):
    """The measurements do not determine a rate (a fit came out at or below zero)."""

    exit_code = 1


# ----------------------------------------------------------------------------- the fit

@dataclass(frozen=True)
class LinearFit:
    """Least squares of times on work: one coefficient per column, with its standard error."""

    coefficients: tuple[float, ...]
    stderr: tuple[float, ...]      # nan where the placements leave no residual degree of freedom
    residual_rms_s: float


def fit_linear(rows: Sequence[Sequence[float]], times: Sequence[float]) -> LinearFit:
    """times[i] ≈ sum_j rows[i][j] · c_j. Columns are scaled to unit size first (bytes ~1e8 beside
    boundary counts ~1), so that the solve is well conditioned."""
    x = np.asarray(rows, dtype=float)
    y = np.asarray(times, dtype=float)
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    coef, *_ = np.linalg.lstsq(xs, y, rcond=None)
    resid = y - xs @ coef
    dof = len(y) - x.shape[1]
    rms = float(np.sqrt(np.mean(resid ** 2))) if len(y) else 0.0
    if dof > 0:
        sigma2 = float(resid @ resid) / dof
        cov = sigma2 * np.linalg.pinv(xs.T @ xs)
        err = np.sqrt(np.clip(np.diag(cov), 0, None)) / scale
    else:
        err = np.full(x.shape[1], math.nan)
    return LinearFit(tuple(float(c) for c in coef / scale), tuple(float(e) for e in err), rms)


@dataclass(frozen=True)
class Observation:
    """One placement's measured time and the work the throughput model says it did."""

    seconds: float
    work: dict[str, float]     # per device: bytes (decode) or FLOPs (prefill)
    n_boundaries: int
    n_device_boundaries: int = 0   # of which between two devices (neither side the host)


@dataclass(frozen=True)
class RateFit:
    """Inverse rates (seconds per byte or per FLOP) by device, and the cost of one split boundary."""

    seconds_per_unit: dict[str, float]
    per_boundary_s: float | None       # None when no placement crossed a boundary
    per_boundary_stderr_s: float
    residual_rms_s: float
    device_extra_s: float | None = None   # what a boundary between two devices costs beyond per_boundary_s
    device_extra_stderr_s: float = math.nan


def fit_rates(observations: Sequence[Observation], per_boundary_s: float | None = None) -> RateFit:
    """Fit t = sum_d work_d · s_d + n_boundaries · b + n_device_boundaries · x over the observations (x: what
    a boundary between two devices costs beyond b, fitted where a placement crosses one); `per_boundary_s`
    given subtracts a known boundary cost instead of fitting it. A device's attention column (`dev + ATTENTION`)
    that fits at or below zero, or leaves the device's own rate there, is dropped (its attention then
    reads at the device's own rate)."""
    devices = sorted({d for o in observations for d in o.work})
    fit_boundary = per_boundary_s is None and any(o.n_boundaries for o in observations)
    fit_device = any(o.n_device_boundaries for o in observations)
    times = [o.seconds - (o.n_boundaries * per_boundary_s if per_boundary_s is not None else 0.0)
             for o in observations]
    while True:
        fit = fit_linear(_rate_rows(observations, devices, fit_boundary, fit_device), times)
        per_unit = dict(zip(devices, fit.coefficients[:len(devices)], strict=True))
        dropped = _unresolved_attention(per_unit)
        if not dropped:
            break
        log.warning("calibration: %s is not told apart from the rest; it reads at the device's own rate", dropped[0])
        devices.remove(dropped[0])
    _check_positive_rates(per_unit)
    tail = len(devices)
    boundary = fit.coefficients[tail] if fit_boundary else per_boundary_s
    boundary_err = fit.stderr[tail] if fit_boundary else 0.0
    extra, extra_err = (fit.coefficients[-1], fit.stderr[-1]) if fit_device else (None, math.nan)
    return RateFit(per_unit, boundary, boundary_err, fit.residual_rms_s, extra, extra_err)


def _rate_rows(observations: Sequence[Observation], devices: list[str], fit_boundary: bool,
               fit_device: bool) -> list[list[float]]:
    """fit_rates' design matrix: each observation's work per device, then its boundary counts where fitted."""
    return [[o.work.get(d, 0.0) for d in devices] + ([float(o.n_boundaries)] if fit_boundary else [])
            + ([float(o.n_device_boundaries)] if fit_device else []) for o in observations]


def _unresolved_attention(per_unit: dict[str, float]) -> list[str]:
    """The attention columns not told apart from their device's weights: one at or below zero, or one that
    leaves its device's own rate there (fit_rates drops them; the others stand)."""
    dropped = [d for d, c in per_unit.items() if d.endswith(ATTENTION) and not c > 0]
    return dropped + [d + ATTENTION for d, c in per_unit.items() if not c > 0 and d + ATTENTION in per_unit]


def _check_positive_rates(per_unit: dict[str, float]) -> None:
    """CalibrationError for a column the fit gives no positive rate: the timings are too noisy."""
    for dev, sec in per_unit.items():
        if not sec > 0:
            raise CalibrationError(f"calibration: the fit gives {dev} no positive rate ({sec:.3g} s per unit); "
                                   "the timings are too noisy (is the machine busy?) — run it again")


# ----------------------------------------------------------------------------- observations

def decode_observation(ctx: ModelContext, costs: CostTable, view: PlacementView, seconds: float) -> Observation:
    """Weight bytes read per token on each device, and (as `dev + ATTENTION_SWEPT`) the cache bytes its
    attention's query heads sweep."""
    weights, _ = decode_bytes(ctx.facts, costs, view)
    work = {d: float(n) for d, n in weights.items() if n}
    for d, att in decode_attention(ctx.facts, costs, view).items():
        if att:
            work[d + ATTENTION_SWEPT] = att.swept
    return Observation(seconds, work, *_boundary_counts(costs, view))


def _boundary_counts(costs: CostTable, view: PlacementView) -> tuple[int, int]:
    """(split boundaries a token crosses, of which between two devices)."""
    pairs = boundaries(costs, view)
    return len(pairs), sum(1 for a, b in pairs if CPU not in (a, b))


def prefill_observation(ctx: ModelContext, costs: CostTable, view: PlacementView, seconds: float
                        ) -> tuple[Observation, dict[str, float]]:
    """FLOPs per ubatch on each device (attention's as `dev + ATTENTION`), and the weight bytes it streams."""
    work = prefill_work(ctx.facts, costs, view, None)    # the devices calibrated here offload no ops
    flops = dict(work.flops)
    flops.update({d + ATTENTION: n for d, n in work.attention.items()})
    return Observation(seconds, flops, *_boundary_counts(costs, view)), dict(work.streamed)


# ----------------------------------------------------------------------------- one rate per piece of hardware

# Joins the members of a group into the column name the fit uses (device names hold no "+").
_JOIN = "+"


def same_hardware(inventory: Inventory) -> dict[str, tuple[str, ...]]:
    """RPC devices that are one piece of hardware, by the column name their pooled rate is fitted under:
    rpc-servers at the same address reporting the same memory serve one device of one machine, or identical
    ones (three loopback rpc-servers on the CPU backend are this machine's CPU three times). Their rates are
    measurements of the same thing, so the fit gives them one rate: fitted apart, each took its own share
    of the machine's drift (on this machine 45-61 tokens/s for three identical servers in the same rounds), and
    the predictions then ranked placements by which server they used. Devices alone in their group are left out."""
    by_key: dict[tuple[str, int], list[str]] = {}
    for dev in inventory.devices:
        if dev.kind is DeviceKind.RPC and dev.endpoint:
            address = dev.endpoint.rsplit(":", 1)[0]
            by_key.setdefault((address, dev.total_bytes), []).append(dev.name)
    return {_JOIN.join(names): tuple(names) for names in by_key.values() if len(names) > 1}


def per_device(figures: Sequence[CalibratedFigure], groups: dict[str, tuple[str, ...]]) -> tuple[CalibratedFigure, ...]:
    """A group's figures written for each of its devices, the method saying the rate is the group's."""
    out: list[CalibratedFigure] = []
    for fig in figures:
        members = groups.get(fig.device)
        if members is None:
            out.append(fig)
            continue
        how = (f"{fig.how}; one figure for {', '.join(members)}: rpc-servers at one address reporting the same "
               "memory, the same hardware, fitted as one column")
        out += [replace(fig, device=m, how=how) for m in members]
    return tuple(out)


@dataclass(frozen=True)
class AttentionCost:
    """Seconds a decoded token's attention takes on a device per cache byte its query heads sweep."""

    per_swept_byte_s: float

    def seconds(self, swept: float) -> float:
        return swept * self.per_swept_byte_s


def without_attention(obs: Observation, costs: dict[str, AttentionCost]) -> Observation:
    """A decode observation less its attention: the swept bytes' known seconds taken off, their columns
    dropped."""
    attention = {d for d in obs.work if d.endswith(ATTENTION_SWEPT)}
    known = sum(cost.seconds(obs.work.get(dev + ATTENTION_SWEPT, 0.0)) for dev, cost in costs.items())
    return replace(obs, seconds=obs.seconds - known, work={d: n for d, n in obs.work.items() if d not in attention})
