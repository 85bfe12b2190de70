"""Running the pinned llama-bench on a placement and reading what it measured.

A placement is written once, in llama.cpp's own flags (`-ngl 10 -dev RPC0,RPC1 -ts 1,1`), and
turned into llama-bench's syntax here: llama-bench separates a device or split LIST with `/` and
SWEEP values with `,` (seed 003 §8: `-dev A,B` would be two single-device runs). The same flags
go through fitplan's estimate, so the throughput model predicts exactly the placement that ran.
"""
from __future__ import annotations

import json
import logging
import statistics
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from planner.core.errors import FitplanError
from planner.hardware.inventory import Inventory
from planner.llama.context import ModelContext
from planner.llama.flags import arg, bench_arg, parse_llama_flags, to_bench_argv
from planner.memory.estimate import estimate
from planner.speed.throughput import PlacementView, experts_on_host_of, view_of_estimate
from planner.system.llama_tools import BUILD_FLAVOR, LLAMA_CPP_PIN

log = logging.getLogger(__name__)

_BENCH_TIMEOUT_S = 900


class BenchError(FitplanError):
    """llama-bench failed or printed nothing this module can read."""

    exit_code = 1


@dataclass(frozen=True)
class Workload:
    """What each llama-bench run measures: pp`n_prompt` and tg`n_gen` at depth `n_depth`."""

    n_prompt: int = 128
    n_gen: int = 16
    n_depth: int = 0
    repeats: int = 3
    threads: int | None = None     # llama-bench -t; None: its default (the machine's cores)


@dataclass(frozen=True)
class Timing:
    """Medians over the repeats: seconds per decoded token and per prompt ubatch; with every sample
    llama-bench reported (tokens/s, one per repeat), where it was measured here."""

    tg_tokens_s: float
    pp_tokens_s: float
    n_ubatch: int          # the ubatch the prompt was processed in (min(-ub, -b, prompt))
    tg_samples: tuple[float, ...] = ()
    pp_samples: tuple[float, ...] = ()
    stolen: float | None = None   # share of the machine's CPU time its hypervisor took while the process ran

    @property
    def tg_s_per_token(self) -> float:
        return 1.0 / self.tg_tokens_s

    @property
    def pp_s_per_ubatch(self) -> float:
        return self.n_ubatch / self.pp_tokens_s


def bench_flags(flags: list[str]) -> list[str]:
    """llama.cpp flags -> llama-bench's: device and split lists joined by `/`, and the switches llama-bench
    takes with a value (`--no-op-offload` is its `-nopo 1`)."""
    return to_bench_argv(flags)


def effective_ubatch(flags: list[str], n_prompt: int) -> int:
    """The ubatch a prompt of n_prompt tokens runs in: llama.cpp's -ub (512) capped by -b (2048) and the prompt."""
    parsed = parse_llama_flags(flags)
    return min(parsed.n_ubatch, parsed.n_batch, n_prompt)


def cpu_jiffies() -> tuple[int, int] | None:
    """(stolen, all) CPU time of every core so far, in clock ticks, from /proc/stat's first line: `steal` is
    the time a virtual machine's cores were ready to run and its hypervisor ran something else. None where
    the file or the field is missing (not Linux, a kernel before 2.6.11)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]    # user nice system idle iowait irq softirq steal
    return ticks[7], sum(ticks)


def stolen_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the CPU time between two cpu_jiffies() readings that the hypervisor took."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def llama_bench_argv(bin_dir: Path, model: str, flags: list[str], work: Workload, rpc: list[str]) -> list[str]:
    """The llama-bench command line of one placement under a workload (JSON output)."""
    argv = [str(bin_dir / "llama-bench"), *bench_arg("model", model), *bench_arg("output", "json"),
            *bench_arg("repetitions", work.repeats), *bench_arg("n_prompt", work.n_prompt),
            *bench_arg("n_gen", work.n_gen), *bench_arg("n_depth", work.n_depth)]
    if work.threads:
        argv += bench_arg("threads", work.threads)
    if rpc:
        argv += bench_arg("rpc", rpc)
    return argv + bench_flags(flags)


def bench_rows(argv: list[str], flags: list[str]) -> tuple[list[dict], float | None]:
    """Run one llama-bench command line: the JSON rows it printed, and the share of the machine's CPU time
    stolen while it ran."""
    log.info("running %s", " ".join(argv))
    before = cpu_jiffies()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_BENCH_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise BenchError(f"llama-bench ran past {_BENCH_TIMEOUT_S} s: {' '.join(argv)}") from None
    stolen = stolen_share(before, cpu_jiffies())
    if done.returncode != 0:
        tail = " / ".join(done.stderr.strip().splitlines()[-3:]) or "no output"
        raise BenchError(f"llama-bench exited {done.returncode} for {' '.join(flags) or 'the host'}: {tail}")
    try:
        rows = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise BenchError(f"llama-bench printed no JSON for {' '.join(flags)}") from None
    return rows, stolen


def timing_of_rows(rows: list[dict], flags: list[str], n_prompt: int, stolen: float | None = None) -> Timing:
    """A Timing from llama-bench's JSON rows of one pp and one tg test (measured now or kept in a record)."""
    pp = [r for r in rows if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0]
    tg = [r for r in rows if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0]
    if not pp or not tg:
        raise BenchError(f"llama-bench reported no pp and tg test for {' '.join(flags)}")
    tg_samples, pp_samples = tuple(tg[0]["samples_ts"]), tuple(pp[0]["samples_ts"])
    return Timing(statistics.median(tg_samples), statistics.median(pp_samples), effective_ubatch(flags, n_prompt),
                  tg_samples, pp_samples, stolen)


def run_llama_bench(bin_dir: Path, model: str, flags: list[str], work: Workload, rpc: list[str]) -> Timing:
    """One llama-bench invocation (pp and tg), JSON output, medians of its samples, and the share of the
    machine's CPU time stolen while it ran."""
    rows, stolen = bench_rows(llama_bench_argv(bin_dir, model, flags, work, rpc), flags)
    return timing_of_rows(rows, flags, work.n_prompt, stolen)


@dataclass(frozen=True)
class BenchJob:
    """One placement for run_rounds: a model and llama.cpp flags under a workload."""

    model: str
    flags: tuple[str, ...]
    work: Workload


def run_rounds(bin_dir: Path, jobs: Sequence[BenchJob], rpc: list[str], rounds: int = 1,
               on_round: Callable[[int], None] | None = None) -> list[list[Timing]]:
    """Every job in `rounds` llama-bench processes, round-robin (all jobs once, then all again): what
    differs between processes (where the weights land in memory, the frequency the cores run at, other
    work on the machine) then falls on every placement alike instead of on whichever ran during it.
    Returns each job's timings, one per round; `on_round(k)` is called before round k (1-based)."""
    out: list[list[Timing]] = [[] for _ in jobs]
    for k in range(1, rounds + 1):
        if on_round is not None:
            on_round(k)
        for job, timings in zip(jobs, out, strict=True):
            timings.append(run_llama_bench(bin_dir, job.model, list(job.flags), job.work, rpc))
    return out


def median_timing(timings: Sequence[Timing]) -> Timing:
    """The median over rounds of each round's medians (the rounds of one placement share their ubatch), with
    every round's samples."""
    return _median_of_rounds(timings, lambda t: 1.0)


def _median_of_rounds(timings: Sequence[Timing], share: Callable[[Timing], float]) -> Timing:
    """The median over rounds of each round's medians divided by `share` of that round, with every round's
    samples as measured."""
    return Timing(statistics.median(t.tg_tokens_s / share(t) for t in timings),
                  statistics.median(t.pp_tokens_s / share(t) for t in timings), timings[0].n_ubatch,
                  tuple(x for t in timings for x in t.tg_samples), tuple(x for t in timings for x in t.pp_samples))


def fastest_timing(timings: Sequence[Timing]) -> Timing:
    """The fastest sample of every round's repeats, decode and prefill apart: what the placement runs at
    when nothing else takes the machine. On shared cores whose neighbours come and go, a sample is slowed by
    whatever ran beside it and never sped up (one llama-bench process of five tg64 repeats here read
    45.5 35.9 41.5 49.3 53.6 tokens/s), so the fastest of many is steadier than their median. Timings
    without their samples (kept before samples were) count with their medians."""
    tg = [x for t in timings for x in (t.tg_samples or (t.tg_tokens_s,))]
    pp = [x for t in timings for x in (t.pp_samples or (t.pp_tokens_s,))]
    return Timing(max(tg), max(pp), timings[0].n_ubatch, tuple(tg), tuple(pp))


def unstolen_timing(timings: Sequence[Timing]) -> Timing:
    """The median over rounds of each round's medians, each first divided by the share of the CPU time the
    machine had while that process ran (1 - stolen): tokens per second of the time the cores were this
    machine's. On a virtual machine whose hypervisor takes 0-20 % of the cores from minute to minute, a
    process that lost a tenth of its cores' time runs about a tenth slower, at no fault of the placement.
    The division is exact where one thread does the work at a time (bench_throughput's host and rpc-servers
    run one each); threads that meet at a barrier every op all wait for a stolen one, so there the figure
    is still below the unstolen speed. Rounds measured without the figure count as measured; the result
    carries no `stolen` of its own (it is corrected already)."""
    return _median_of_rounds(timings, lambda t: 1.0 - (t.stolen or 0.0))


ESTIMATES: dict[str, Callable[[Sequence[Timing]], Timing]] = {"median": median_timing, "fastest": fastest_timing,
                                                              "unstolen": unstolen_timing}


def bench_version(bin_dir: Path) -> str:
    """llama-bench's own version line and the pin it was built from."""
    done = subprocess.run([str(bin_dir / "llama-bench"), "--version"], capture_output=True, text=True,
                          timeout=60, check=False)
    first = next((line for line in (done.stdout + done.stderr).splitlines() if line.startswith("version")), "")
    return f"llama-bench {first.removeprefix('version:').strip() or 'unknown version'}, {BUILD_FLAVOR} build of " \
           f"{LLAMA_CPP_PIN}"


@dataclass(frozen=True)
class PlacementViews:
    """The throughput model's views of one placement: one for its tg test, one for its pp test."""

    decode: PlacementView
    prefill: PlacementView


def placement_views(ctx: ModelContext, flags: list[str], inventory: Inventory, work: Workload,
                    rpc: list[str]) -> PlacementViews:
    """What fitplan's estimate makes of the flags, at the cache fill each llama-bench test runs at:
    tg reads n_depth cells plus half the generated ones on average; pp's ubatches attend over the depth
    plus half the prompt on average (prefill_cells adds half a ubatch itself)."""
    rpc_args = arg("rpc", rpc) if rpc else []
    n_ctx = work.n_depth + max(work.n_prompt, work.n_gen)
    parsed = parse_llama_flags([*flags, *rpc_args, *arg("n_ctx", max(n_ctx, 256))])
    est = estimate(ctx, parsed, inventory)
    experts = experts_on_host_of(est)
    base = view_of_estimate(ctx, est, experts, est.output_on_host)
    ubatch = min(base.n_ubatch, work.n_prompt)
    decode = replace(base, n_past=work.n_depth + work.n_gen // 2)
    prefill = replace(base, n_ubatch=ubatch, n_batch=min(base.n_batch, work.n_prompt),
                      n_past=work.n_depth + (work.n_prompt - ubatch) // 2)
    return PlacementViews(decode, prefill)


