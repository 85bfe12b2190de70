"""What a validate run reports: the request, each device's measured and predicted bytes, and the verdict."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from planner.checking.allreduce_report import AllReduceReport
from planner.core.render import table
from planner.core.units import fmt_bytes, fmt_mib
from planner.gguf.reader import ModelFile
from planner.hardware.budgets import Budgets, over_verdict
from planner.hardware.inventory import HOST, Inventory
from planner.llama.flags import LlamaFlags

DEFAULT_PROMPT_TOKENS = 32
DEFAULT_GEN_TOKENS = 16
COMPUTE_TOLERANCE = 0.05   # the bar for the compute column


@dataclass(frozen=True)
class ValidateRequest:
    model: str
    flags: LlamaFlags
    inventory: Inventory | None = None
    budgets: dict[str, int] = field(default_factory=dict)   # device name or Host -> bytes
    n_prompt: int = DEFAULT_PROMPT_TOKENS
    n_gen: int = DEFAULT_GEN_TOKENS
    model_file: ModelFile | None = field(default=None, repr=False, compare=False)   # the header, when already read
    uma_pool_bytes: int | None = None    # what Host and `pool_devices` hold together (Budgets.uma_pool_bytes)
    pool_devices: tuple[str, ...] = ()

    @property
    def limits(self) -> Budgets:
        """`budgets` and the pool as one Budgets (a host budget of 0 when `budgets` has no Host)."""
        return Budgets.from_rows(self.budgets, self.uma_pool_bytes, self.pool_devices)


def with_budgets(req: ValidateRequest, budgets: Budgets, host: bool = True) -> ValidateRequest:
    """`req` judged against `budgets`, its shared pool included; `host`: False when the host's RAM
    is unknown, so the host has no budget (and no pool)."""
    if not host:
        return replace(req, budgets=dict(budgets.devices), uma_pool_bytes=None, pool_devices=())
    return replace(req, budgets=budgets.rows(), uma_pool_bytes=budgets.uma_pool_bytes,
                   pool_devices=budgets.pool_devices)


@dataclass(frozen=True)
class DeviceReport:
    name: str
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    predicted: tuple[int, int, int] | None      # (model, context, compute) from the estimate
    budget_bytes: int | None
    seconds_per_token: float                    # time in this device's splits per generated token

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes


@dataclass(frozen=True)
class ValidateReport:
    engine: str
    model: str
    flags: str
    devices: tuple[DeviceReport, ...]
    n_splits_prompt: int
    n_splits_gen: int
    copied_bytes_per_token: int | None      # None: the engine does not report it (llama.cpp)
    seconds_per_split: float
    prompt_tokens_s: float
    gen_tokens_s: float
    verdict: str
    fits: bool
    notes: tuple[str, ...] = ()
    executed: bool = True       # False: --reserve-only (graph, passes, splits, allocator; nothing computed)
    allreduce: AllReduceReport | None = None   # -sm tensor: the meta backend's reduces per token, and llama.cpp's
    peak_rss_bytes: int | None = None   # this process's peak resident set (ru_maxrss); None: not measured here

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine, "model": self.model, "flags": self.flags, "verdict": self.verdict,
            "fits": self.fits,
            "devices": [{"name": d.name, "weights_bytes": d.weights_bytes, "kv_bytes": d.kv_bytes,
                         "compute_bytes": d.compute_bytes, "budget_bytes": d.budget_bytes,
                         "predicted": None if d.predicted is None else
                         dict(zip(("model_bytes", "context_bytes", "compute_bytes"), d.predicted, strict=True)),
                         "seconds_per_token": round(d.seconds_per_token, 6)} for d in self.devices],
            "splits": {"prompt": self.n_splits_prompt, "generation": self.n_splits_gen},
            "copied_bytes_per_token": self.copied_bytes_per_token,
            "seconds_per_split": round(self.seconds_per_split, 6),
            "prompt_tokens_s": round(self.prompt_tokens_s, 2), "gen_tokens_s": round(self.gen_tokens_s, 2),
            "notes": list(self.notes), "executed": self.executed,
            "allreduce": None if self.allreduce is None else self.allreduce.to_dict(),
            "peak_rss_bytes": self.peak_rss_bytes,
        }

    def to_table(self) -> str:
        def pred(d: DeviceReport, i: int) -> str:
            return "-" if d.predicted is None else fmt_mib(d.predicted[i])

        rows = [[d.name, fmt_mib(d.weights_bytes), pred(d, 0), fmt_mib(d.kv_bytes), pred(d, 1),
                 fmt_mib(d.compute_bytes), pred(d, 2), "-" if d.budget_bytes is None else fmt_mib(d.budget_bytes),
                 f"{d.seconds_per_token * 1e3:.1f}" if d.seconds_per_token else "-"] for d in self.devices]
        copied = "-" if self.copied_bytes_per_token is None else fmt_bytes(self.copied_bytes_per_token)
        lines = [f"{self.model} [{self.engine}] {self.flags}"]
        if not self.devices:
            return "\n".join(lines + [f"note: {n}" for n in self.notes] + ["", f"verdict: {self.verdict}"]) + "\n"
        lines += ["", table(["device", "weights MiB", "(pred)", "KV MiB", "(pred)", "compute MiB", "(pred)",
                        "budget MiB", "ms/token"], rows, align="lrrrrrrrr"), ""]
        if not self.executed:
            lines += [f"splits: prompt {self.n_splits_prompt}, generation {self.n_splits_gen} "
                      f"(reserve only: the graphs were split and allocated, not computed)"]
        else:
            lines += [f"splits: prompt {self.n_splits_prompt}, generation {self.n_splits_gen}; "
                      f"copied per token {copied}; {self.seconds_per_split * 1e3:.2f} ms per split",
                      f"speed: prompt {self.prompt_tokens_s:.1f} tokens/s, generation {self.gen_tokens_s:.1f} tokens/s"]
        if self.allreduce is not None:
            lines.append(self.allreduce.line())
        if self.peak_rss_bytes is not None:
            lines.append(f"peak RSS: {fmt_mib(self.peak_rss_bytes)} MiB (this process)")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines + ["", f"verdict: {self.verdict}"]) + "\n"


def prompt_ids(n: int, n_vocab: int, bos: int | None) -> list[int]:
    """A fixed token-id prompt: BOS, then ids spread over the vocabulary (deterministic)."""
    start = [bos] if bos is not None and 0 <= bos < n_vocab else []
    return (start + [(1000 + 7919 * i) % n_vocab for i in range(n)])[:n]


@dataclass(frozen=True)
class Verdict:
    text: str
    fits: bool
    notes: tuple[str, ...]


def judge(devices: tuple[DeviceReport, ...], slack: int = 0, compute_rel: float = COMPUTE_TOLERANCE,
          compute_abs: int = 0, uma_pool_bytes: int | None = None, pool_devices: tuple[str, ...] = ()) -> Verdict:
    """Verdict and notes; `slack` bytes absorb an engine's rounding of weights/KV (llama.cpp logs
    MiB with two decimals); compute may differ by `compute_rel` of the larger figure or by
    `compute_abs` bytes, whichever is more. Each row is judged against its budget and, with
    `uma_pool_bytes`, Host and `pool_devices` together against their shared pool (Budgets.over)."""
    rows = {d.name: d.budget_bytes for d in devices if d.budget_bytes is not None}
    limits = Budgets.from_rows(rows, uma_pool_bytes if HOST in rows else None, pool_devices)
    over = over_verdict(limits, {d.name: d.total_bytes for d in devices if d.name in rows})
    if over is not None:
        return Verdict(over, False, ())
    notes = []
    for d in devices:
        if d.predicted is None:
            continue
        pm, pc, pk = d.predicted
        if abs(pm - d.weights_bytes) > slack or abs(pc - d.kv_bytes) > slack:
            notes.append(f"{d.name}: weights/KV differ from the estimate "
                         f"({fmt_mib(d.weights_bytes)}/{fmt_mib(d.kv_bytes)} vs {fmt_mib(pm)}/{fmt_mib(pc)} MiB)")
        if abs(d.compute_bytes - pk) > max(compute_rel * max(pk, d.compute_bytes, 1), compute_abs):
            notes.append(f"{d.name}: compute {fmt_mib(d.compute_bytes)} MiB vs estimated {fmt_mib(pk)} MiB")
    budgets = any(d.budget_bytes is not None for d in devices)
    verdict = "fits" + ("" if budgets else " (no budgets given: capacities unlimited)")
    verdict += "; the estimate is off, see notes" if notes else "; matches the estimate"
    return Verdict(verdict, True, tuple(notes))
