"""`fitplan calibrate`: this machine's rates, measured with the pinned llama-bench (docs/internals/calibration.md).

The throughput model (planner/speed/throughput.py) says what each placement asks of each device — weight and
KV-cache bytes read per decoded token, FLOPs and streamed weights per prompt ubatch, split boundaries — and
llama-bench says how long the placement took. Over a few placements of one model (calibration_placements: the
host alone; each RPC endpoint alone, with the output layer on the host, with half the layers, with every FFN on
the host, at a context depth; each endpoint's layers with the output alone on the next; all endpoints evenly) the
times are linear in the unknown inverse rates:

    t_token  = sum_d (R_d / BW_d + Sw_d / Bsweep_d) + n_boundaries · lat + n_device_boundaries · (lat_dev − lat)
    t_ubatch = sum_d (F_d / FLOPS_d + A_d / FLOPSatt_d + S_d / BW_d) + n_boundaries · (lat + B·A / link)

Attention's sweep rate comes first, from what a depth adds to the same placement (least squares through the
origin, the weights' time cancelling); then least squares gives each device's streaming bandwidth, the per-split
hand-off latency, what a boundary between two devices costs beyond it, the FLOP rates and, where the copy stands
out of the noise, the link. RPC devices that are one piece of hardware (same_hardware) are fitted as one column.
The figures go into the inventory's `calibrated:` block with the method next to each.
"""
from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from planner.core.render import table
from planner.hardware.detect import detect_inventory
from planner.hardware.inventory import CalibratedFigure, Calibration, DeviceKind, Inventory, Quantity
from planner.hardware.inventory_yaml import inventory_yaml_dict
from planner.llama.commands import BENCH_NGL_ALL
from planner.llama.context import model_context
from planner.llama.flags import arg
from planner.llama.placement import CPU
from planner.measuring.llama_bench import (
    ESTIMATES,
    BenchJob,
    Timing,
    Workload,
    bench_version,
    placement_views,
    run_rounds,
)
from planner.model.costs import cost_table
from planner.registry.examples import resolve_model
from planner.speed.calibration_fit import (
    ATTENTION,
    ATTENTION_SWEPT,
    AttentionCost,
    Observation,
    RateFit,
    decode_observation,
    fit_rates,
    per_device,
    prefill_observation,
    same_hardware,
    without_attention,
)
from planner.speed.throughput import (
    ACTIVATION_BYTES_PER_VALUE,
    RPC_SPLIT_LATENCY_S,
)
from planner.system.llama_tools import ensure_tools

log = logging.getLogger(__name__)

CALIBRATION_MODEL = "example:gemma3-270m"
# An -ot rule that keeps the output matrix in host memory, tied (token_embd) or not.
OUTPUT_ON_HOST = r"^(output|token_embd)\.weight=CPU"
# An -ot rule that keeps every layer's dense FFN weights in host memory: two boundaries a layer.
FFN_ON_HOST = r"^blk\.\d+\.ffn_(gate|up|down)\.weight=CPU"
# The context depth of the runs that measure attention (llama-bench -d): long enough that reading the
# KV cache is a large share of a token on the calibration model (its global layers see every cell).
CALIBRATION_DEPTH = 2048
# A fitted copy time below this many standard errors is not told apart from noise.
_SIGNIFICANT_SIGMAS = 2.0


# ----------------------------------------------------------------------------- the placements

@dataclass(frozen=True)
class CalibrationRun:
    """A placement of the calibration model, what llama-bench measured, and the model's view of it."""

    name: str
    flags: tuple[str, ...]
    timing: Timing
    decode: Observation
    prefill: Observation
    streamed: dict[str, float] = field(default_factory=dict)   # weight bytes per device a prompt ubatch reads
    depth: int = 0
    probe: bool = False     # a run of the attention probe (CalibrateRequest.probe): attention's figures only


@dataclass(frozen=True)
class CalibrationPlacement:
    name: str
    flags: tuple[str, ...]
    depth: int = 0          # llama-bench -d
    probe: bool = False     # runs CalibrateRequest.probe, not the calibration model


def calibration_placements(n_layer: int, rpc_devices: Sequence[str], depth: int = CALIBRATION_DEPTH,
                           probe: bool = False) -> list[CalibrationPlacement]:
    """The host alone and at `depth`; each endpoint alone with the output layer (one boundary), with the
    output kept on the host (two), with half the layers (one, the host streaming the rest), with every
    layer's FFN on the host (two a layer) and at `depth`; with several endpoints, each one's layers with the
    output layer on the next (`-ts n_layer,1`: llama.cpp counts the output as layer n_layer, so the next
    endpoint gets it alone — one boundary between two devices), and every endpoint evenly (one per
    endpoint). With `probe`, the attention probe too, on the host and on each endpoint alone, at depth 0
    and at `depth`, right after the calibration model's run at depth there."""
    host = tuple(arg("n_gpu_layers", 0))
    out = [CalibrationPlacement("host", host), CalibrationPlacement(f"host, depth {depth}", host, depth),
           *_probe_placements("host", host, depth, probe)]
    nxt = _next_endpoints(rpc_devices)
    for dev in rpc_devices:
        every = (*arg("devices", dev), *arg("n_gpu_layers", BENCH_NGL_ALL))
        out.append(CalibrationPlacement(f"{dev} all", every))
        if dev in nxt:   # run right after the endpoint alone: the machine's drift over minutes falls on both
            out.append(CalibrationPlacement(f"{dev} layers, output on {nxt[dev]}",
                                            (*arg("devices", (dev, nxt[dev])), *arg("n_gpu_layers", BENCH_NGL_ALL),
                                             *arg("tensor_split", (n_layer, 1)))))
        out += [CalibrationPlacement(f"{dev} layers, output on host",
                                     (*every, *arg("override_tensor", OUTPUT_ON_HOST))),
                CalibrationPlacement(f"{dev} half", (*arg("devices", dev), *arg("n_gpu_layers", n_layer // 2))),
                CalibrationPlacement(f"{dev} all, FFN on host", (*every, *arg("override_tensor", FFN_ON_HOST))),
                CalibrationPlacement(f"{dev} all, depth {depth}", every, depth),
                *_probe_placements(f"{dev} all", every, depth, probe)]
    if len(rpc_devices) > 1:
        out.append(CalibrationPlacement("split evenly", (
            *arg("devices", tuple(rpc_devices)), *arg("n_gpu_layers", BENCH_NGL_ALL),
            *arg("tensor_split", (1,) * len(rpc_devices)))))
    return out


def _probe_placements(name: str, flags: tuple[str, ...], depth: int, probe: bool) -> list[CalibrationPlacement]:
    if not probe:
        return []
    return [CalibrationPlacement(f"probe: {name}", flags, 0, True),
            CalibrationPlacement(f"probe: {name}, depth {depth}", flags, depth, True)]


def _next_endpoints(rpc_devices: Sequence[str]) -> dict[str, str]:
    """Each endpoint's next one, in a ring; with two endpoints one pair (the same two servers, the same
    boundary)."""
    if len(rpc_devices) < 2:
        return {}
    ring = dict(zip(rpc_devices, [*rpc_devices[1:], rpc_devices[0]], strict=True))
    return ring if len(rpc_devices) > 2 else {rpc_devices[0]: rpc_devices[1]}


# ----------------------------------------------------------------------------- calibrate

@dataclass(frozen=True)
class CalibrateRequest:
    rpc: tuple[str, ...] = ()
    model: str = CALIBRATION_MODEL
    work: Workload = Workload()
    depth: int = CALIBRATION_DEPTH    # of the runs that measure attention
    probe: str | None = None          # a model of other attention shapes, run at both depths for attention's figure
    rounds: int = 1                   # llama-bench processes per placement, interleaved (run_rounds)
    estimate: str = "fastest"         # how a placement's samples make its figure (llama_bench.ESTIMATES)


@dataclass(frozen=True)
class CalibrateResult:
    inventory: Inventory          # this machine's, with the calibrated block
    runs: tuple[CalibrationRun, ...]
    model: str

    def document(self) -> dict[str, Any]:
        """The inventory YAML `--devices` reads back."""
        return inventory_yaml_dict(self.inventory, self.model)

    def to_dict(self) -> dict[str, Any]:
        runs = [{"placement": r.name, "flags": " ".join(r.flags), "tg_tokens_s": round(r.timing.tg_tokens_s, 2),
                 "pp_tokens_s": round(r.timing.pp_tokens_s, 2), "boundaries": r.decode.n_boundaries}
                for r in self.runs]
        return {"inventory": self.document(), "runs": runs}

    def to_table(self) -> str:
        rows = [[r.name, " ".join(r.flags), str(r.decode.n_boundaries), f"{r.timing.tg_tokens_s:.1f}",
                 f"{r.timing.pp_tokens_s:.0f}"] for r in self.runs]
        lines = [table(["placement", "flags", "boundaries", "tg t/s", "pp t/s"], rows, "llrrr"), ""]
        cal = self.inventory.calibration
        assert cal is not None
        for fig in cal.figures:
            value, unit = _FIGURE_UNITS[fig.quantity]
            lines.append(f"{fig.device} {fig.quantity.value}: {fig.value / value:.4g} {unit} — {fig.how}")
        lines.append(f"measured {cal.date} with {cal.tool}")
        return "\n".join(lines) + "\n"


# how the table prints each quantity: (scale, unit)
_FIGURE_UNITS: dict[Quantity, tuple[float, str]] = {
    Quantity.BANDWIDTH: (1e9, "GB/s"), Quantity.FLOPS: (1e12, "TFLOPS"), Quantity.SPLIT_LATENCY: (1e-6, "µs"),
    Quantity.LINK: (1e9, "GB/s"), Quantity.ATTENTION_BANDWIDTH: (1e9, "GB/s"), Quantity.DEVICE_LATENCY: (1e-6, "µs"),
    Quantity.ATTENTION_FLOPS: (1e12, "TFLOPS"), Quantity.ATTENTION_CELLS: (1e6, "M pairs/s"),
    Quantity.ATTENTION_VALUES: (1e9, "G values/s"), Quantity.ATTENTION_SWEEP: (1e9, "GB/s"),
}


def calibration_jobs(request: CalibrateRequest, inventory: Inventory) -> dict[str, BenchJob]:
    """The llama-bench runs `calibrate` makes, by placement name, in its order: what a bench that
    interleaves them with its own placements runs before calling `calibrate(..., measured=)`.
    `inventory`: this machine's with request.rpc, as the caller detected it."""
    path = resolve_model(request.model)
    return _jobs(request, path, model_context(path).facts.n_layer, inventory)


def _placements(request: CalibrateRequest, n_layer: int, inventory: Inventory) -> list[CalibrationPlacement]:
    rpc_devices = [d.name for d in inventory.devices if d.kind is DeviceKind.RPC]
    return calibration_placements(n_layer, rpc_devices, request.depth, request.probe is not None)


def _jobs(request: CalibrateRequest, path: str, n_layer: int, inventory: Inventory) -> dict[str, BenchJob]:
    probe = resolve_model(request.probe) if request.probe else ""
    return {place.name: BenchJob(probe if place.probe else path, place.flags,
                                 replace(request.work, n_depth=place.depth))
            for place in _placements(request, n_layer, inventory)}


def calibrate(request: CalibrateRequest, bin_dir: Path | None = None,
              measured: dict[str, Timing] | None = None, measured_how: str = "replayed timings") -> CalibrateResult:
    """Measure the host and each RPC endpoint of `request` and return the inventory with its rates.
    `measured` (placement name -> timing) takes timings measured elsewhere instead of running llama-bench,
    said in the method as `measured_how`: timings of an earlier run, the same measurements fitted by the
    model as it is now (bench_throughput --replay), or runs interleaved with a bench's own."""
    bin_dir = bin_dir or ensure_tools()
    rpc = list(request.rpc)
    inventory = detect_inventory(rpc)
    skipped = [d.name for d in inventory.devices if d.kind is not DeviceKind.RPC]
    if skipped:
        log.warning("calibrate measures the host and RPC devices; %s keep their stated rates", ", ".join(skipped))
    path = resolve_model(request.model)
    ctx = model_context(path)
    costs = cost_table(ctx.model, ctx.facts)
    probe_ctx = model_context(resolve_model(request.probe)) if request.probe else ctx
    models = {False: (ctx, costs), True: (probe_ctx, cost_table(probe_ctx.model, probe_ctx.facts))}
    load_before = os.getloadavg()[0]
    jobs = _jobs(request, path, ctx.facts.n_layer, inventory)
    probes = {p.name for p in _placements(request, ctx.facts.n_layer, inventory) if p.probe}
    if measured is not None:
        missing = [name for name in jobs if name not in measured]
        if missing:   # timings kept before a placement joined the list
            log.warning("calibration: no timing for %s; fitted without", ", ".join(missing))
            jobs = {name: job for name, job in jobs.items() if name in measured}
        timings = [measured[name] for name in jobs]
    else:
        timings = [ESTIMATES[request.estimate](t) for t in run_rounds(bin_dir, list(jobs.values()), rpc,
                                                                      request.rounds, _log_round(request))]
    runs = []
    for (name, job), timing in zip(jobs.items(), timings, strict=True):
        probe = name in probes
        run_ctx, run_costs = models[probe]
        views = placement_views(run_ctx, list(job.flags), inventory, job.work, rpc)
        log.info("calibration run %s: tg %.2f t/s, pp %.2f t/s", name, timing.tg_tokens_s, timing.pp_tokens_s)
        prefill, streamed = prefill_observation(run_ctx, run_costs, views.prefill, timing.pp_s_per_ubatch)
        runs.append(CalibrationRun(name, job.flags, timing,
                                   decode_observation(run_ctx, run_costs, views.decode, timing.tg_s_per_token),
                                   prefill, streamed, job.work.n_depth, probe))
    groups = same_hardware(inventory)
    calibration = calibration_of([pooled(r, groups) for r in runs], request, bin_dir, ctx.facts.n_embd)
    calibration = replace(calibration, figures=per_device(calibration.figures, groups))
    # timings on a shared machine are only as good as its quiet: say how busy it was
    load = f"; 1-minute load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    calibration = replace(calibration, method=calibration.method + (f" ({measured_how})" if measured else load))
    return CalibrateResult(replace(inventory, calibration=calibration), tuple(runs), request.model)


def _log_round(request: CalibrateRequest) -> Callable[[int], None] | None:
    if request.rounds == 1:
        return None
    return lambda k: log.info("calibration round %d of %d", k, request.rounds)


# ----------------------------------------------------------------------------- one rate per piece of hardware

def _column(device: str, groups: dict[str, tuple[str, ...]]) -> str:
    """The fit's column of a work key (a device, or a device's attention pairs or values)."""
    dev, blank, suffix = device.partition(" ")
    for group, members in groups.items():
        if dev in members:
            return group + blank + suffix
    return device


def _pooled_work(work: dict[str, float], groups: dict[str, tuple[str, ...]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for dev, n in work.items():
        col = _column(dev, groups)
        out[col] = out.get(col, 0.0) + n
    return out


def pooled(run: CalibrationRun, groups: dict[str, tuple[str, ...]]) -> CalibrationRun:
    """A run with the work of each group's devices under the group's one column."""
    if not groups:
        return run
    return replace(run, decode=replace(run.decode, work=_pooled_work(run.decode.work, groups)),
                   prefill=replace(run.prefill, work=_pooled_work(run.prefill.work, groups)),
                   streamed=_pooled_work(run.streamed, groups))


def attention_costs(runs: Sequence[CalibrationRun]) -> dict[str, AttentionCost]:
    """A decoded token's attention cost, by device: from each placement run at depth 0 and at a depth, the
    seconds the depth adds, with the cache bytes its query heads sweep that the depth adds — the two runs differ
    in nothing else, so the weights' time cancels (a joint least squares would share it with the device's
    bandwidth column, which the other placements pull). Several pairs of runs on one device (the probe's, a
    group of same_hardware) are observations of the same cost: least squares through the origin. A device whose
    depth adds no time gets no figure."""
    shallow = {(r.probe, r.flags): r for r in runs if not r.depth}
    added: dict[str, list[tuple[float, float]]] = {}    # device -> (seconds, swept bytes) added
    for deep in (r for r in runs if r.depth and (r.probe, r.flags) in shallow):
        base = shallow[deep.probe, deep.flags].decode
        swept = {d.removesuffix(ATTENTION_SWEPT): n - base.work.get(d, 0.0)
                 for d, n in deep.decode.work.items() if d.endswith(ATTENTION_SWEPT)}
        swept = {d: n for d, n in swept.items() if n > 0}
        if len(swept) == 1:
            [(dev, n)] = swept.items()
            added.setdefault(dev, []).append((deep.decode.seconds - base.seconds, n))
    out: dict[str, AttentionCost] = {}
    for dev, observed in added.items():
        per_byte = sum(s * n for s, n in observed) / sum(n * n for _, n in observed)
        if not per_byte > 0:
            log.warning("calibration: %s at depth ran no slower than at depth 0; its attention has no figure", dev)
            continue
        out[dev] = AttentionCost(per_byte)
    return out


def calibration_of(runs: Sequence[CalibrationRun], request: CalibrateRequest, bin_dir: Path,
                   n_embd: int) -> Calibration:
    """The fits over the runs, as figures with how each was obtained."""
    work = request.work
    attention = attention_costs(runs)
    every_run, runs = runs, [r for r in runs if not r.probe]     # the probe's runs give attention's figures only
    decode, unmeasured = _decode_fit([without_attention(r.decode, attention) for r in runs])
    prefill, flops_how = _prefill_fit(runs, decode)
    over = f"least squares over {len(runs)} placement{'s' if len(runs) > 1 else ''} of {request.model}"
    depths = f"at depths 0 and {request.depth}"
    figures = [CalibratedFigure(dev, Quantity.BANDWIDTH, 1.0 / sec, f"tg{work.n_gen}: weight bytes read per token "
                                f"(fitplan's cost table) ÷ seconds per token, {over}")
               for dev, sec in decode.seconds_per_unit.items()]
    figures += _attention_figures(attention, f"tg{work.n_gen} {depths} of the same placement", request)
    figures += [_rate_figure(dev, sec, (Quantity.FLOPS, f"pp{work.n_prompt}: FLOPs per ubatch (fitplan's prefill "
                                        f"model) ÷ seconds per ubatch {flops_how}, {over}"),
                             (Quantity.ATTENTION_FLOPS, f"pp{work.n_prompt} {depths}: attention FLOPs per ubatch ÷ "
                              f"their seconds, {over}"))
                for dev, sec in prefill.seconds_per_unit.items()]
    figures += _split_figures(runs, decode, prefill, n_embd, over)
    return Calibration(datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       _calibration_source(every_run, request) + unmeasured, bench_version(bin_dir), tuple(figures))


def _decode_fit(observed: list[Observation]) -> tuple[RateFit, str]:
    """The decode rates and the split latency fitted over the runs, and a note when the latency is not told
    apart from noise: then the model's assumed latency is kept and the rates are fitted under it."""
    decode = fit_rates(observed)
    if decode.per_boundary_s is None or decode.per_boundary_s > _SIGNIFICANT_SIGMAS * _finite(
            decode.per_boundary_stderr_s):
        return decode, ""
    log.warning("calibration: the per-split hand-off latency fits at %.0f ± %.0f µs, not told apart from noise; "
                "keeping the assumed %.0f µs", decode.per_boundary_s * 1e6, decode.per_boundary_stderr_s * 1e6,
                RPC_SPLIT_LATENCY_S * 1e6)
    unmeasured = (f"; the per-split hand-off latency fit {decode.per_boundary_s * 1e6:.0f} ± "
                  f"{decode.per_boundary_stderr_s * 1e6:.0f} µs, not told apart from noise: the assumed "
                  f"{RPC_SPLIT_LATENCY_S * 1e6:.0f} µs is kept and the rates are fitted under it")
    return replace(fit_rates(observed, RPC_SPLIT_LATENCY_S), per_boundary_s=None), unmeasured


def _prefill_fit(runs: list[CalibrationRun], decode: RateFit) -> tuple[RateFit, str]:
    """The prompt's FLOP rates, and how they were obtained. A prompt's ubatch also streams its weights: that
    time, at the bandwidths just fitted, is not FLOPs — unless it would leave a prompt no time at all: then
    the fitted "bandwidth" is mostly per-token overhead (a model too small for its bytes to show), and the
    FLOPs are fitted with the streaming left in."""
    streaming = [sum(n * decode.seconds_per_unit.get(d, 0.0) for d, n in r.streamed.items()) for r in runs]
    left = [r.prefill.seconds - t for r, t in zip(runs, streaming, strict=True)]
    if all(t > 0 for t in left):
        return (fit_rates([replace(r.prefill, seconds=t) for r, t in zip(runs, left, strict=True)]),
                "less the weights it streams at the fitted bandwidth")
    log.warning("calibration: streaming the weights at the fitted bandwidth takes longer than a prompt took; "
                "the FLOPs are fitted with the streaming in them")
    return (fit_rates([r.prefill for r in runs]),
            "with the weights' streaming in it (at the fitted bandwidth it would take longer than the prompt took)")


def _split_figures(runs: list[CalibrationRun], decode: RateFit, prefill: RateFit, n_embd: int,
                   over: str) -> list[CalibratedFigure]:
    """The rpc devices' split latency and link figures (where the latency was fitted) and their own latency."""
    rpc_devices = sorted(d for d in decode.seconds_per_unit if d != CPU and not d.endswith(ATTENTION))
    if not rpc_devices:
        return []
    figures = []
    if decode.per_boundary_s is not None:
        figures = [CalibratedFigure(dev, Quantity.SPLIT_LATENCY, decode.per_boundary_s,
                                    "per-split hand-off latency: the slope of seconds per token against the "
                                    "number of split boundaries "
                                    f"(±{decode.per_boundary_stderr_s * 1e6:.0f} µs), each device's bytes ÷ "
                                    f"bandwidth the other terms, {over}")
                   for dev in rpc_devices]
        figures += _link_figures(rpc_devices, runs, decode, prefill, n_embd, over)
    return figures + _device_latency_figures(rpc_devices, decode, over)


def _calibration_source(runs: Sequence[CalibrationRun], request: CalibrateRequest) -> str:
    """How the calibration was measured: the llama-bench command, each placement, the estimate and the fit."""
    work = request.work
    return (f"llama-bench -p {work.n_prompt} -n {work.n_gen} -d 0 or {request.depth} -r {work.repeats}"
            f"{f' -t {work.threads}' if work.threads else ''} on {request.model}"
            f"{f' and the probe {request.probe}' if request.probe else ''}: "
            + "; ".join(f"{r.name} ({' '.join(r.flags)}{f' -d {r.depth}' if r.depth else ''})" for r in runs)
            + f"; {_estimate_text(request)}; rates fitted by least squares "
            "on fitplan's own bytes, FLOPs and boundary counts (planner/measuring/calibrate.py)")


def _attention_figures(attention: dict[str, AttentionCost], runs: str, request: CalibrateRequest
                       ) -> list[CalibratedFigure]:
    models = f"{request.model} and the probe {request.probe}" if request.probe else request.model
    return [CalibratedFigure(dev, Quantity.ATTENTION_SWEEP, 1.0 / cost.per_swept_byte_s,
                             f"{runs}, of {models}: the cache bytes the depth adds to what a token's query heads "
                             "sweep (query heads x cells x the layer's K and V bytes a cell) ÷ the seconds it adds, "
                             "least squares through the origin")
            for dev, cost in attention.items()]


def _estimate_text(request: CalibrateRequest) -> str:
    """How each placement's figure was had from its samples, for the method line."""
    rounds = f"{request.rounds} llama-bench processes a placement, run round-robin"
    if request.estimate == "median":
        return "medians of the repeats" + (f", then of {rounds}" if request.rounds > 1 else "")
    if request.estimate == "unstolen":
        return ("medians of the repeats, each divided by the share of CPU time the hypervisor left its process"
                + (f", then their median over {rounds}" if request.rounds > 1 else ""))
    return "the fastest sample of the repeats" + (f" of {rounds}" if request.rounds > 1 else "") + \
        " (a sample on shared cores is only ever slowed by other work)"


def _rate_figure(column: str, seconds_per_unit: float, plain: tuple[Quantity, str],
                 attention: tuple[Quantity, str]) -> CalibratedFigure:
    """A fitted column as a figure: a device's own rate, or (`dev + ATTENTION`) its attention's."""
    if column.endswith(ATTENTION):
        return CalibratedFigure(column.removesuffix(ATTENTION), attention[0], 1.0 / seconds_per_unit, attention[1])
    return CalibratedFigure(column, plain[0], 1.0 / seconds_per_unit, plain[1])


def _finite(x: float) -> float:
    return 0.0 if math.isnan(x) else x


def _device_latency_figures(rpc_devices: list[str], decode: RateFit, over: str) -> list[CalibratedFigure]:
    """A boundary between two devices: the per-split hand-off latency plus what the fit puts on such a
    boundary beyond it (the placements that split the layers over the endpoints cross them). The fitted extra
    is the best estimate the timings give, so it is written whenever it is above zero, its error and whether
    it stands out of the noise said in the method: dropping an extra that is not told apart from noise would
    charge such boundaries nothing, though the fit comes out above zero in most calibrations and bench_verdict's
    one-stream splits measure slower than one device by about that. No figure where it fits at or below zero:
    such boundaries then cost the split latency."""
    extra, err = decode.device_extra_s, decode.device_extra_stderr_s
    if extra is None:
        return []
    base = decode.per_boundary_s if decode.per_boundary_s is not None else RPC_SPLIT_LATENCY_S
    if not extra > 0:
        log.warning("calibration: a boundary between two devices fits at %+.0f ± %.0f µs beyond the split latency; "
                    "no device-to-device figure is written", extra * 1e6, _finite(err) * 1e6)
        return []
    told = not math.isnan(err) and extra > _SIGNIFICANT_SIGMAS * err
    if not told:
        log.warning("calibration: a boundary between two devices fits at %+.0f ± %.0f µs beyond the split latency, "
                    "not told apart from noise; written as the fit's best estimate", extra * 1e6, _finite(err) * 1e6)
    how = (f"device-to-device hand-off: the per-split hand-off latency plus the slope of seconds per token against "
           f"the boundaries between two devices ({extra * 1e6:+.0f} ± {_finite(err) * 1e6:.0f} µs beyond it"
           + ("" if told else f"; within {_SIGNIFICANT_SIGMAS:g} standard errors of none, the fit's best estimate")
           + f"), {over}")
    return [CalibratedFigure(dev, Quantity.DEVICE_LATENCY, base + extra, how) for dev in rpc_devices]


def _link_figures(rpc_devices: list[str], runs: Sequence[CalibrationRun], decode: RateFit, prefill: RateFit,
                  n_embd: int, over: str) -> list[CalibratedFigure]:
    """The boundary copy: the prefill fit's per-boundary cost less the hand-off latency, over the bytes
    of the ubatch's activations. Where the copy is not told apart from noise there is no figure: the
    bound the noise allows is the most pessimistic link the data admit, not a measurement of it, and
    a plan predicted from it would charge every boundary that worst case (the device's stated link, or
    the assumed one, is used, and the prediction says so)."""
    assert decode.per_boundary_s is not None
    ubatch = min(r.timing.n_ubatch for r in runs)
    copy_bytes = ubatch * n_embd * ACTIVATION_BYTES_PER_VALUE
    copy_s = (prefill.per_boundary_s or 0.0) - decode.per_boundary_s
    noise = math.hypot(prefill.per_boundary_stderr_s, decode.per_boundary_stderr_s)
    if math.isnan(noise) or copy_s <= _SIGNIFICANT_SIGMAS * noise:
        log.warning("calibration: the boundary copy of a pp ubatch (%d B) fits at %.0f ± %.0f µs, not told apart "
                    "from noise; no link figure is written", copy_bytes, copy_s * 1e6,
                    0.0 if math.isnan(noise) else noise * 1e6)
        return []
    how = (f"boundary copy: (prefill per-boundary cost − hand-off latency) = {copy_s * 1e6:.0f} µs for "
           f"{copy_bytes} B of activations, {over}")
    return [CalibratedFigure(dev, Quantity.LINK, copy_bytes / copy_s, how) for dev in rpc_devices]
