"""The throughput model against llama-bench: decode and prefill of 26 placements, predicted and measured.

    python -m bench.bench_throughput [--rounds 8] [--repeats 3] [--n-gen 16] [--estimate steady|unstolen|median|fastest]
                                     [--calibrated INVENTORY.yaml] [--save TIMINGS.json | --replay TIMINGS.json]

Runs the pinned llama-bench (pp128, tg16) for every placement in PLACEMENTS: the host alone, partial offload, two
and three loopback rpc-servers, routed experts kept on the host, different -ts, -ub and depths (-d). Each is
predicted through the path a plan takes (fitplan's estimate of the flags, then planner/speed/throughput.py) from
an inventory `fitplan calibrate` fits on the same rpc-servers in the same rounds (unless --calibrated gives one).
Prints per placement the relative error, then the median relative error and Spearman's rank correlation of decode
and prefill, the worst placement of each, and the measurement's own noise (samples of one process against the
processes' medians; odd rounds ranked against even rounds: the most a model can match here).

A placement's figure is the median over --rounds llama-bench processes, run round-robin over the list. --estimate
says what each process contributes: steady (default) divides each process's medians by the CPU share the
hypervisor left it (/proc/stat steal) and by the whole machine's speed in its round; unstolen only the first;
median neither; fastest is the fastest sample. By default each core runs a lowest-priority busy loop while
measuring (--keep-awake), so a hand-off to a process on the other vCPU does not wait for the hypervisor to wake it.
Measures only below --max-load (1-minute load average). --save keeps every timing; --replay re-predicts a saved
run with today's model (bench/results/README.md). This machine's "devices" share 2 cores and one memory bus: it
checks the hand-off, overhead and ranking terms, not a GPU's bandwidth. Asserts nothing.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import yaml
from gguf import GGMLQuantizationType

from bench.quiet import NotQuiet, cores_kept_awake, load_line, pin_to_cores, wait_for_quiet
from bench.ranks import pearson, spearman
from planner.hardware.detect import detect_inventory
from planner.hardware.inventory import Inventory
from planner.hardware.inventory_yaml import load_inventory
from planner.llama.context import ModelContext, model_context
from planner.measuring.calibrate import OUTPUT_ON_HOST, CalibrateRequest, calibrate, calibration_jobs
from planner.measuring.llama_bench import (
    ESTIMATES,
    BenchJob,
    Timing,
    Workload,
    median_timing,
    placement_views,
    run_rounds,
    unstolen_timing,
)
from planner.model.costs import CostTable, cost_table
from planner.registry.examples import resolve_model
from planner.speed.throughput import predict
from planner.synth.gguf_factory import add_tokenizer, llama_spec, qwen3moe_spec
from planner.synth.tiny_models import write_random
from planner.system.llama_tools import ensure_tools, rpc_servers

N_RPC = 3
STEADY = "steady"
# the bench's estimates (--estimate), each as the llama_bench.ESTIMATES entry that makes a placement's figure of
# its rounds: steady is unstolen's, of the rounds steady_rounds has first divided by the machine's speed in each
ROUND_ESTIMATE = {**{name: name for name in ESTIMATES}, STEADY: "unstolen"}
# how the summary names each estimate
ESTIMATE_SAYS = {"fastest": "sample of all rounds' repeats", "median": "of the rounds' medians",
                 "unstolen": "of the rounds' medians, each divided by the CPU time's share the hypervisor left it",
                 STEADY: "of the rounds' medians, each divided by the CPU time's share the hypervisor left it and "
                 "by the machine's speed in its round"}
# what each half of the rounds is taken as, when the odd rounds are ranked against the even
HALF_SAYS = {"fastest": "fastest samples of each half", "median": "medians of each half",
             "unstolen": "unstolen medians of each half", STEADY: "steady medians of each half"}
N_PROMPT = 128
# tg16 x 3 repeats in each of 8 processes: a figure moves with the process and the minutes it runs in more than
# with its samples, so the bench spends its time on more processes of fewer samples. A --save file keeps the
# n_gen, repeats and rounds it was measured with
N_GEN = 16
REPEATS = 3
ROUNDS = 8
GEMMA = "example:gemma3-270m"
MOE = "moe"   # written by write_moe below
PROBE = "attention probe"   # written by write_probe below: the calibration's second attention shape


@dataclass(frozen=True)
class Placement:
    name: str
    model: str            # GEMMA or MOE
    flags: tuple[str, ...]   # llama.cpp flags (lists with ','; turned into llama-bench's '/')
    depth: int = 0        # llama-bench -d


_ALL3 = ("-dev", "RPC0,RPC1,RPC2", "-ngl", "999")
_ALL2 = ("-dev", "RPC0,RPC1", "-ngl", "999")

PLACEMENTS: tuple[Placement, ...] = (
    Placement("host only", GEMMA, ("-ngl", "0")),
    Placement("host only, -ub 32", GEMMA, ("-ngl", "0", "-ub", "32")),
    Placement("host only, depth 1024", GEMMA, ("-ngl", "0"), depth=1024),
    Placement("RPC0 all", GEMMA, ("-dev", "RPC0", "-ngl", "999")),
    Placement("RPC0 all, output on host", GEMMA, ("-dev", "RPC0", "-ngl", "999", "-ot", OUTPUT_ON_HOST)),
    Placement("RPC0 all, -ub 64", GEMMA, ("-dev", "RPC0", "-ngl", "999", "-ub", "64")),
    Placement("RPC0 all, depth 1024", GEMMA, ("-dev", "RPC0", "-ngl", "999"), depth=1024),
    Placement("partial: 10 of 19 on RPC0", GEMMA, ("-dev", "RPC0", "-ngl", "10")),
    Placement("partial: 5 of 19 on RPC0", GEMMA, ("-dev", "RPC0", "-ngl", "5")),
    Placement("RPC0+RPC1 -ts 1,1", GEMMA, (*_ALL2, "-ts", "1,1")),
    Placement("RPC0+RPC1 -ts 3,1", GEMMA, (*_ALL2, "-ts", "3,1")),
    Placement("RPC0+RPC1 -ts 1,3", GEMMA, (*_ALL2, "-ts", "1,3")),
    Placement("RPC0+RPC1 -ts 1,1 -ub 32", GEMMA, (*_ALL2, "-ts", "1,1", "-ub", "32")),
    Placement("partial: 10 on RPC0+RPC1 -ts 1,1", GEMMA, ("-dev", "RPC0,RPC1", "-ngl", "10", "-ts", "1,1")),
    Placement("RPC0+RPC1+RPC2 -ts 1,1,1", GEMMA, (*_ALL3, "-ts", "1,1,1")),
    Placement("RPC0+RPC1+RPC2 -ts 2,1,1", GEMMA, (*_ALL3, "-ts", "2,1,1")),
    Placement("RPC0+RPC1+RPC2 -ts 1,1,1 depth 1024", GEMMA, (*_ALL3, "-ts", "1,1,1"), depth=1024),
    Placement("partial: 12 on RPC0+RPC1+RPC2", GEMMA, ("-dev", "RPC0,RPC1,RPC2", "-ngl", "12", "-ts", "1,1,1")),
    Placement("MoE host only", MOE, ("-ngl", "0")),
    Placement("MoE RPC0 all", MOE, ("-dev", "RPC0", "-ngl", "999")),
    Placement("MoE RPC0, experts on host", MOE, ("-dev", "RPC0", "-ngl", "999", "-ot", "exps=CPU")),
    Placement("MoE RPC0, experts of 4 layers on host", MOE, ("-dev", "RPC0", "-ngl", "999", "-ncmoe", "4")),
    Placement("MoE RPC0+RPC1 -ts 1,1, experts on host", MOE, (*_ALL2, "-ts", "1,1", "-ot", "exps=CPU")),
    Placement("MoE partial: 5 of 9 on RPC0", MOE, ("-dev", "RPC0", "-ngl", "5")),
    # the MoE at depth (its heads are 64 wide, the calibration model's 256), where the KV cache outweighs its few
    # active weights
    Placement("MoE host only, depth 2048", MOE, ("-ngl", "0"), depth=2048),
    Placement("MoE RPC0 all, depth 2048", MOE, ("-dev", "RPC0", "-ngl", "999"), depth=2048),
)


def timings_json(calibration: dict[str, list[Timing]], placements: dict[str, list[Timing]], work: Workload,
                 rounds: int, cores: list[int], kept_awake: bool) -> dict:
    """What was measured, for --replay: per calibration run and per placement one timing per round (its
    medians and every sample); the cores every process ran on."""
    def one(t: Timing) -> dict:
        out: dict = {"tg_tokens_s": t.tg_tokens_s, "pp_tokens_s": t.pp_tokens_s, "n_ubatch": t.n_ubatch}
        if t.tg_samples:
            out.update(tg_samples=list(t.tg_samples), pp_samples=list(t.pp_samples))
        if t.stolen is not None:
            out["stolen"] = t.stolen
        return out
    return {"repeats": work.repeats, "rounds": rounds, "n_prompt": work.n_prompt, "n_gen": work.n_gen, "cores": cores,
            "kept_awake": kept_awake,
            "calibration": {name: [one(t) for t in ts] for name, ts in calibration.items()},
            "placements": {name: [one(t) for t in ts] for name, ts in placements.items()}}


def _timing(v: dict) -> Timing:
    return Timing(v["tg_tokens_s"], v["pp_tokens_s"], v["n_ubatch"], tuple(v.get("tg_samples", ())),
                  tuple(v.get("pp_samples", ())), v.get("stolen"))


def _round_timings(doc: dict) -> dict[str, list[Timing]]:
    """A --save file's timings by name, one per round (older files kept the calibration's
    medians alone, and files of one round a single timing)."""
    return {name: [_timing(t) for t in v] if isinstance(v, list) else [_timing(v)] for name, v in doc.items()}


@dataclass(frozen=True)
class RoundSpeed:
    """How fast the whole machine ran in one round, against its usual speed: decode and prefill apart."""

    tg: float
    pp: float


def round_speeds(runs: Iterable[Sequence[Timing]]) -> tuple[RoundSpeed, ...]:
    """Each round's speed: the median, over every placement measured in that round (pass the calibration's
    with the bench's: they run in the same rounds), of its unstolen figure in the round over the median of its
    unstolen figures of all rounds. Unstolen, so that a round slowed by the hypervisor is not divided twice.
    Runs with fewer rounds than the longest (older files keep the calibration's median of rounds
    alone) say nothing of a round and are left out."""
    runs = list(runs)
    n = max(len(r) for r in runs)
    unstolen = [[unstolen_timing([t]) for t in r] for r in runs if len(r) == n]

    def speed(k: int, figure: str) -> float:
        return statistics.median(getattr(r[k], figure) / statistics.median(getattr(t, figure) for t in r)
                                 for r in unstolen)
    return tuple(RoundSpeed(speed(k, "tg_tokens_s"), speed(k, "pp_tokens_s")) for k in range(n))


def steady_rounds(timings: dict[str, list[Timing]], speeds: Sequence[RoundSpeed]) -> dict[str, list[Timing]]:
    """Every round's timings (medians and samples) divided by that round's speed (round_speeds): a measurement
    correction, like unstolen's division by the CPU time's share, not a term of the model. This machine's speed
    drifts by tens of percent over the hour a run takes with nothing stolen (one run's rounds lay between
    1.38x and 0.79x the placements' medians, decode), and a placement's median of 8 such rounds then holds whichever
    rounds happened to fall 4th and 5th for it: the drift becomes noise in its figure, and so in the ranks.
    Dividing a round by one factor for all its placements cannot change how the placements rank within that
    round (round_repeatability reads the same); it only takes out the machine-wide change of speed from one
    round to the next. The factor is a median over the round's placements, so one placement slow in one round
    alone stays slow; drift within a round (its calibration runs come first, its placements after) stays too.
    `stolen` is kept, so the unstolen estimate still applies (unstolen and drift divide alike, in either order).
    Runs with another number of rounds than `speeds` (a kept median of rounds) are left as they are."""
    def one(t: Timing, s: RoundSpeed) -> Timing:
        return replace(t, tg_tokens_s=t.tg_tokens_s / s.tg, pp_tokens_s=t.pp_tokens_s / s.pp,
                       tg_samples=tuple(x / s.tg for x in t.tg_samples),
                       pp_samples=tuple(x / s.pp for x in t.pp_samples))
    return {name: [one(t, s) for t, s in zip(ts, speeds, strict=True)] if len(ts) == len(speeds) else ts
            for name, ts in timings.items()}


def speeds_line(speeds: Sequence[RoundSpeed]) -> str:
    return (f"the machine's speed in each round (round_speeds, which {STEADY} divides by): decode "
            + " ".join(f"{s.tg:.2f}" for s in speeds) + ", prefill " + " ".join(f"{s.pp:.2f}" for s in speeds))


@dataclass(frozen=True)
class Row:
    placement: Placement
    boundaries: int
    tg_measured: float
    tg_predicted: float
    pp_measured: float
    pp_predicted: float
    spread: str
    timings: tuple[Timing, ...]    # one per round

    @property
    def tg_error(self) -> float:
        return abs(self.tg_predicted - self.tg_measured) / self.tg_measured

    @property
    def pp_error(self) -> float:
        return abs(self.pp_predicted - self.pp_measured) / self.pp_measured


def write_moe(directory: Path) -> Path:
    """A small qwen3moe with random Q8_0 weights (gguf-py quantizes no k-quant): 8 layers, 16 experts of
    width 512, 2 used."""
    spec = qwen3moe_spec(n_layer=8, n_embd=512, n_head=8, n_head_kv=2, head_dim=64, n_expert=16,
                         n_expert_used=2, n_ff_exp=512, n_vocab=4096)
    spec.tensors = [(n, q if q == GGMLQuantizationType.F32 else GGMLQuantizationType.Q8_0, s)
                    for n, q, s in spec.tensors]
    add_tokenizer(spec, 4096, n_merges=8)
    return write_random(directory / "moe.gguf", spec)


def write_probe(directory: Path) -> Path:
    """The calibration's attention probe: a small dense llama with random Q8_0 weights, 4 layers, 8 query heads
    64 wide over 4 KV heads (Gemma 3's, the calibration model's: 4 query heads over one 256-wide KV head) — not the
    MoE's 8 layers and 2 KV heads, so the MoE's placements at depth are predicted from other models' attention."""
    Q8 = GGMLQuantizationType.Q8_0
    spec = llama_spec(n_layer=4, n_embd=512, n_head=8, n_head_kv=4, n_ff=1024, n_vocab=4096,
                      attn_type=Q8, ffn_type=Q8, down_type=Q8, out_type=Q8)
    add_tokenizer(spec, 4096, n_merges=8)
    return write_random(directory / "attention-probe.gguf", spec)


def measure(placements: tuple[Placement, ...], models: dict[str, str], endpoints: list[str], work: Workload,
            rounds: int) -> dict[str, list[Timing]]:
    """llama-bench on each placement, `rounds` processes each, run round-robin: each placement's timings,
    one per round."""
    per_round = run_rounds(ensure_tools(), placement_jobs(placements, models, work), endpoints, rounds,
                           _print_round(rounds))
    return {p.name: t for p, t in zip(placements, per_round, strict=True)}


def compare(placements: tuple[Placement, ...], models: dict[str, str], inventory: Inventory, endpoints: list[str],
            work: Workload, measured: dict[str, list[Timing]], estimate: Callable[[list[Timing]], Timing],
            show: bool = True) -> list[Row]:
    """Each placement's measurement (`estimate` of its rounds) beside the prediction."""
    rows = []
    for p, job in zip(placements, placement_jobs(placements, models, work), strict=True):
        (ctx, costs), timings = _model_costs(models[p.model]), measured[p.name]
        views = placement_views(ctx, list(p.flags), inventory, job.work, endpoints)
        decode = predict(ctx.facts, costs, views.decode, inventory)
        prefill = predict(ctx.facts, costs, views.prefill, inventory)
        timing = estimate(timings)
        row = Row(p, decode.n_boundaries, timing.tg_tokens_s, decode.decode_tokens_s, timing.pp_tokens_s,
                  prefill.prefill_tokens_s, spread(timings), tuple(timings))
        if show:
            print(f"  {p.name:<42} tg {row.tg_measured:7.1f} (pred {row.tg_predicted:7.1f}, {row.tg_error:5.1%})  "
                  f"pp {row.pp_measured:7.1f} (pred {row.pp_predicted:7.1f}, {row.pp_error:5.1%})  "
                  f"boundaries {row.boundaries}  rounds {row.spread}", flush=True)
        rows.append(row)
    return rows


@functools.cache
def _model_costs(path: str) -> tuple[ModelContext, CostTable]:
    """A model's header and cost table, read once however many estimates compare its placements."""
    ctx = model_context(path)
    return ctx, cost_table(ctx.model, ctx.facts)


def placement_jobs(placements: tuple[Placement, ...], models: dict[str, str], work: Workload) -> list[BenchJob]:
    return [BenchJob(models[p.model], p.flags, replace(work, n_depth=p.depth)) for p in placements]


def _print_round(rounds: int) -> Callable[[int], None]:
    return lambda k: print(f"  round {k} of {rounds}, load {load_line()}", flush=True)


def spread(timings: list[Timing]) -> str:
    """How far the rounds of one placement lie apart: (max - min) / median, tg and pp."""
    if len(timings) < 2:
        return "1 round"
    med = median_timing(timings)
    tg = [t.tg_tokens_s for t in timings]
    pp = [t.pp_tokens_s for t in timings]
    return f"tg ±{(max(tg) - min(tg)) / 2 / med.tg_tokens_s:.0%} pp ±{(max(pp) - min(pp)) / 2 / med.pp_tokens_s:.0%}"


def summary(rows: list[Row], work: Workload) -> list[str]:
    tg_rho = spearman([r.tg_measured for r in rows], [r.tg_predicted for r in rows])
    pp_rho = spearman([r.pp_measured for r in rows], [r.pp_predicted for r in rows])
    worst_tg = max(rows, key=lambda r: r.tg_error)
    worst_pp = max(rows, key=lambda r: r.pp_error)
    tg_med = statistics.median(r.tg_error for r in rows)
    pp_med = statistics.median(r.pp_error for r in rows)
    return [
        f"placements: {len(rows)}",
        f"decode  (tg{work.n_gen}):  median relative error {tg_med:.1%} (target <= 20 %), Spearman {tg_rho:.3f} "
        f"(target >= 0.9); worst: {worst_tg.placement.name} ({worst_tg.tg_error:.1%})",
        f"prefill (pp{work.n_prompt}): median relative error {pp_med:.1%} (target <= 30 %), Spearman {pp_rho:.3f} "
        f"(target >= 0.8); worst: {worst_pp.placement.name} ({worst_pp.pp_error:.1%})",
    ]


def repeatability(rows: list[Row], other: dict[str, list[Timing]],
                  estimate: Callable[[list[Timing]], Timing] = median_timing) -> list[str]:
    """Spearman of this run's measurements against another run's, placement by placement: the ceiling of
    any model's rank correlation on this machine (two runs of llama-bench are not ranked alike either)."""
    both = [r for r in rows if r.placement.name in other]
    theirs = [estimate(other[r.placement.name]) for r in both]
    tg = spearman([r.tg_measured for r in both], [t.tg_tokens_s for t in theirs])
    pp = spearman([r.pp_measured for r in both], [t.pp_tokens_s for t in theirs])
    return [f"repeatability: this run's measurements against the other run's ({len(both)} placements): decode "
            f"Spearman {tg:.3f}, prefill {pp:.3f}"]


def round_repeatability(rows: list[Row]) -> list[str]:
    """Spearman of one round's measurements against another's, over every pair of rounds: how alike two
    single llama-bench processes rank the placements (the median of the rounds is steadier than either)."""
    n = min(len(r.timings) for r in rows)
    if n < 2:
        return []
    def rho(i: int, j: int, figure: str) -> float:
        return spearman([getattr(r.timings[i], figure) for r in rows],
                         [getattr(r.timings[j], figure) for r in rows])
    pairs = list(itertools.combinations(range(n), 2))
    tg = [rho(i, j, "tg_tokens_s") for i, j in pairs]
    pp = [rho(i, j, "pp_tokens_s") for i, j in pairs]
    return [f"rounds against each other ({n} rounds, {len(tg)} pairs): decode Spearman {min(tg):.3f}–{max(tg):.3f}, "
            f"prefill {min(pp):.3f}–{max(pp):.3f}"]


def noise(rows: list[Row], estimate: str = "median") -> list[str]:
    """Where the measurement's noise lies: the spread (sd of the logarithm, as a percentage) of one process's
    samples and of the processes' medians, the median over placements; where the rounds carry it, the share of
    the CPU time the hypervisor stole while each process ran and how it goes with that process's slowness (its
    log deviation from its placement's median of rounds, Pearson over every process); and the Spearman of the
    odd rounds' figures (by `estimate`, a ROUND_ESTIMATE key, of the rows' rounds as they are) against the even
    rounds'."""
    def sd(xs: list[float]) -> float:
        return statistics.stdev(math.log(x) for x in xs) if len(xs) > 1 and min(xs) > 0 else math.nan

    lines = []
    for label, samples, figure in (("decode", "tg_samples", "tg_tokens_s"), ("prefill", "pp_samples", "pp_tokens_s")):
        within = [sd(list(getattr(t, samples))) for r in rows for t in r.timings if len(getattr(t, samples)) > 1]
        between = [sd([getattr(t, figure) for t in r.timings]) for r in rows if len(r.timings) > 1]
        if within and between:
            lines.append(f"noise, {label}: samples of one process apart by {statistics.median(within):.1%}, the "
                         f"processes' medians by {statistics.median(between):.1%} (sd, median over placements)")
    lines += _stolen_lines(rows)
    if min(len(r.timings) for r in rows) >= 2:
        odd = [ESTIMATES[ROUND_ESTIMATE[estimate]](r.timings[0::2]) for r in rows]
        even = [ESTIMATES[ROUND_ESTIMATE[estimate]](r.timings[1::2]) for r in rows]
        tg = spearman([t.tg_tokens_s for t in odd], [t.tg_tokens_s for t in even])
        pp = spearman([t.pp_tokens_s for t in odd], [t.pp_tokens_s for t in even])
        lines.append(f"odd rounds against even rounds ({HALF_SAYS[estimate]}): decode Spearman {tg:.3f}, "
                     f"prefill {pp:.3f}")
    return lines


def _stolen_lines(rows: list[Row]) -> list[str]:
    """The stolen share of every process, and its Pearson correlation with the process's slowness (decode and
    prefill): log(its figure / its placement's median of rounds). Nothing when no round carries the share."""
    pairs = [(t, r) for r in rows for t in r.timings if t.stolen is not None]
    if len(pairs) < 3:
        return []
    shares = [t.stolen for t, _ in pairs]
    medians = {r.placement.name: median_timing(r.timings) for r in rows}
    out = [f"stolen by the hypervisor: {statistics.median(shares):.1%} of the CPU time in the median process "
           f"({min(shares):.1%}–{max(shares):.1%}, {len(shares)} processes)"]
    slow = []
    for figure in ("tg_tokens_s", "pp_tokens_s"):
        dev = [math.log(getattr(t, figure) / getattr(medians[r.placement.name], figure)) for t, r in pairs]
        slow.append(pearson(shares, dev))
    out.append(f"a process's stolen share against its log deviation from its placement's median: Pearson decode "
               f"{slow[0]:.3f}, prefill {slow[1]:.3f}")
    return out


def table(rows: list[Row]) -> list[str]:
    out = ["| placement | flags | -d | boundaries | tg measured | tg predicted | err | pp measured | pp predicted "
           "| err | rounds apart |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.placement.name} | `{' '.join(r.placement.flags)}` | {r.placement.depth} | {r.boundaries} "
                   f"| {r.tg_measured:.1f} | {r.tg_predicted:.1f} | {r.tg_error:.1%} | {r.pp_measured:.1f} "
                   f"| {r.pp_predicted:.1f} | {r.pp_error:.1%} | {r.spread} |")
    return out


def measured_rounds(args: argparse.Namespace, endpoints: list[str], inventory: Inventory,
                    placements: tuple[Placement, ...], models: dict[str, str], replay: dict | None, work: Workload
                    ) -> tuple[dict[str, list[Timing]], dict[str, list[Timing]], str]:
    """The calibration's timings and the placements', one per round (replayed, or measured here), and how
    the calibration's were had (for its method line). With --calibrated the calibration is not run."""
    if replay:
        return (_round_timings(replay["calibration"]), _round_timings(replay["placements"]),
                "replayed timings")
    if args.calibrated:
        return {}, measure(placements, models, endpoints, work, args.rounds), ""
    # the calibration's runs go round-robin with the placements': a machine whose speed drifts (this one's
    # moves by tens of percent over minutes) then moves both alike
    print("calibrating on these rpc-servers (fitplan calibrate's placements), in the same rounds as the "
          "placements ...", flush=True)
    cal_jobs = calibration_jobs(CalibrateRequest(tuple(endpoints), work=work, probe=models[PROBE]), inventory)
    jobs = list(cal_jobs.values()) + placement_jobs(placements, models, work)
    per_round = run_rounds(ensure_tools(), jobs, endpoints, args.rounds, _print_round(args.rounds))
    n_cal = len(cal_jobs)
    return (dict(zip(cal_jobs, per_round[:n_cal], strict=True)),
            {p.name: t for p, t in zip(placements, per_round[n_cal:], strict=True)},
            f"run in the same rounds as bench_throughput's {len(placements)} placements")


def calibrated(args: argparse.Namespace, endpoints: list[str], inventory: Inventory,
               cal_rounds: dict[str, list[Timing]], how: str, work: Workload, estimate: str, show: bool,
               probe: str | None) -> Inventory:
    """The inventory to predict from: --calibrated's, or calibrate's fit of the calibration's rounds, each
    placement taken by `estimate` (an ESTIMATES key, the same as the placements')."""
    if args.calibrated:
        return replace(inventory, calibration=load_inventory(args.calibrated).calibration)
    request = CalibrateRequest(tuple(endpoints), work=work, probe=probe, rounds=args.rounds, estimate=estimate)
    measured = {name: ESTIMATES[estimate](t) for name, t in cal_rounds.items()}
    result = calibrate(request, measured=measured, measured_how=how)
    if show:
        print(result.to_table())
        if args.write_calibrated:
            args.write_calibrated.write_text(yaml.safe_dump(result.document(), sort_keys=False, allow_unicode=True))
    return result.inventory


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("planner.measuring.calibrate").setLevel(logging.INFO)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=REPEATS, help="llama-bench -r for every placement")
    ap.add_argument("--n-gen", type=int, default=N_GEN, help="llama-bench -n: the tokens each decode sample "
                    "generates (a --replay file's own figure wins)")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="llama-bench processes a placement, run round-robin "
                    "over the placements (the calibration's too)")
    ap.add_argument("--estimate", choices=sorted(ROUND_ESTIMATE), default=STEADY,
                    help="what a placement's figure is, for the calibration and the placements alike: the median of "
                    "its rounds' medians each divided by the share of CPU time the hypervisor left its process "
                    "(unstolen), the same with each round also divided by the machine's speed in it "
                    "(steady, the default), the plain median of its rounds' medians, or the fastest "
                    "sample of all its rounds; the summary gives all four")
    ap.add_argument("--calibrated", type=Path, help="a calibrated inventory to predict from (default: calibrate "
                    "on the bench's own rpc-servers first)")
    ap.add_argument("--write-calibrated", type=Path, help="write the calibrated inventory here")
    ap.add_argument("--max-load", type=float, default=1.5, help="measure only below this 1-minute load average")
    ap.add_argument("--max-wait-s", type=float, default=1800)
    ap.add_argument("--markdown", type=Path, help="also write the table and the summary here")
    ap.add_argument("--threads", type=int, default=1,
                    help="llama-bench -t for the host (default 1, as each rpc-server runs: a two-thread host on two "
                    "shared cores waits at every op's barrier whenever other work holds a core)")
    ap.add_argument("--cores", default="", help="run llama-bench and every rpc-server on these cores only ('0': "
                    "all on one; default: the cores this process may use)")
    ap.add_argument("--keep-awake", action=argparse.BooleanOptionalAction, default=True,
                    help="keep every core of --cores busy with a lowest-priority loop while measuring "
                    "(cores_kept_awake; default on): a woken process then starts at once instead of after the "
                    "hypervisor wakes a halted core")
    ap.add_argument("--only", help="run only placements whose name contains this")
    ap.add_argument("--save", type=Path, help="write every timing measured (calibration and placements) here, as JSON")
    ap.add_argument("--replay", type=Path, help="measure nothing: calibrate and compare with the timings of a --save "
                    "file (the same measurements, predicted by the model as it is now)")
    ap.add_argument("--against", type=Path, help="a --save file of another run: also print how well the two runs' "
                    "measurements rank alike (Spearman measured vs measured: the most any model can reach here)")
    args = ap.parse_args()
    replay = json.loads(args.replay.read_text()) if args.replay else None
    placements = tuple(p for p in PLACEMENTS if not args.only or args.only in p.name)
    if replay is not None:
        args.rounds = replay.get("rounds", 1)
        args.repeats, args.n_gen = replay.get("repeats", args.repeats), replay.get("n_gen", 16)
    work = Workload(N_PROMPT, args.n_gen, 0, args.repeats, args.threads)
    cores = pin_to_cores(args.cores) if replay is None else replay.get("cores")
    kept_awake = args.keep_awake if replay is None else replay.get("kept_awake", False)
    print(f"== throughput model vs llama-bench: {len(placements)} placements, pp{N_PROMPT} / tg{args.n_gen}, "
          f"{args.repeats} repeats in each of {args.rounds} rounds, host threads {args.threads or 'default'}, "
          f"every process on cores {cores if cores is not None else 'unrecorded'}"
          + (", kept awake" if kept_awake else ""))
    for i, p in enumerate(placements):
        print(f"  {i + 1:2d}. {p.name:<42} {p.model:<22} {' '.join(p.flags)}" + (f" -d {p.depth}" if p.depth else ""))
    print(f"this machine: {os.cpu_count()} cores and one memory bus shared by the host and all {N_RPC} rpc-servers "
          "(one thread each): this checks the hand-off and overhead terms and the ranking, not real GPUs' "
          "bandwidth ratios")
    with tempfile.TemporaryDirectory(prefix="fitplan-bench-tp-") as tmp:
        models = {GEMMA: resolve_model(GEMMA), MOE: str(write_moe(Path(tmp))), PROBE: str(write_probe(Path(tmp)))}
        if replay is None:
            try:
                wait_for_quiet(args.max_load, time.monotonic() + args.max_wait_s)
            except NotQuiet as e:
                sys.exit(str(e))
        # the busy loops count in the load average: it is measured before they start
        with cores_kept_awake(cores if kept_awake and replay is None else []), rpc_servers(N_RPC) as endpoints:
            print(f"load average at start: {load_line()}")
            inventory = detect_inventory(endpoints)    # the devices as the rpc-servers report them, asked once
            cal_rounds, placement_rounds, how = measured_rounds(args, endpoints, inventory, placements, models, replay,
                                                                work)
            print(f"load average at end: {load_line()}")
            if args.save:
                args.save.write_text(json.dumps(timings_json(cal_rounds, placement_rounds, work, args.rounds, cores,
                                                             kept_awake), indent=1) + "\n")
            speeds = round_speeds([*cal_rounds.values(), *placement_rounds.values()])
            steadied = {STEADY: (steady_rounds(cal_rounds, speeds), steady_rounds(placement_rounds, speeds),
                                 f"{how}, each round divided by the machine's speed in it")}
            by_estimate = {}
            for name in [args.estimate, *(e for e in ROUND_ESTIMATE if e != args.estimate)]:
                show = name == args.estimate
                logging.getLogger("planner.measuring.calibrate").setLevel(logging.INFO if show else logging.WARNING)
                if show:
                    print(f"each figure below: the {name} {ESTIMATE_SAYS[name]}")
                # files saved before the probe joined the calibration have no probe runs: calibrated without it
                probe = models[PROBE] if replay is None or any(n.startswith("probe: ") for n in cal_rounds) else None
                its_cal, its_placements, its_how = steadied.get(name, (cal_rounds, placement_rounds, how))
                predicting = calibrated(args, endpoints, inventory, its_cal, its_how, work, ROUND_ESTIMATE[name], show,
                                        probe)
                by_estimate[name] = compare(placements, models, predicting, endpoints, work, its_placements,
                                            ESTIMATES[ROUND_ESTIMATE[name]], show)
    report(by_estimate, args, work, speeds)


def report(by_estimate: dict[str, list[Row]], args: argparse.Namespace, work: Workload,
           speeds: Sequence[RoundSpeed]) -> None:
    """The summary of every estimate (--estimate's first, whose rows the table shows), printed and, with
    --markdown, written with the table."""
    rows = by_estimate[args.estimate]
    lines = []
    for name, its_rows in by_estimate.items():
        lines += [f"-- {name} {ESTIMATE_SAYS[name]}{' (the table)' if name == args.estimate else ''}:",
                  *summary(its_rows, work)]
    lines += [speeds_line(speeds), *round_repeatability(rows), *noise(rows, args.estimate)]
    if args.against:
        doc = json.loads(args.against.read_text())
        other = _round_timings(doc["placements"])
        if args.estimate == STEADY:
            other = steady_rounds(other, round_speeds([*_round_timings(doc["calibration"]).values(), *other.values()]))
        lines += repeatability(rows, other, ESTIMATES[ROUND_ESTIMATE[args.estimate]])
    print("\n".join(lines))
    if args.markdown:
        args.markdown.write_text("\n".join(table(rows) + [""] + lines) + "\n")


if __name__ == "__main__":
    main()
