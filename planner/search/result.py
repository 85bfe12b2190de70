"""A plan as data and as text: the request, the result, llama.cpp and llama-bench flags, a
per-device table and the JSON the command prints (`fitplan plan --format json`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.core.errors import BadInput
from planner.core.render import layer_ranges, table
from planner.core.units import fmt_mib
from planner.hardware.budgets import Budgets
from planner.hardware.inventory import Inventory
from planner.llama.commands import LLAMA_BENCH, LLAMA_SERVER, BenchArgv, bench_argv, command_line, server_argv
from planner.llama.flags import LlamaFlags, arg, flags_to_argv, has_flag
from planner.llama.placement import CPU_REPACK, HOST_ROWS, device_of
from planner.llama.tensor_parallel import META_NAME
from planner.memory.analytic import SIMULATED
from planner.memory.estimate import (
    COMPANION_TITLES,
    Estimate,
    companion_dict,
    compute_note,
    overhead_dict,
    overhead_notes,
    split_note,
)
from planner.search.solve import Objective, Solver
from planner.speed.throughput import Prediction
from runtime.ggml.profiles import Backend


@dataclass(frozen=True)
class Companions:
    """Models the plan loads beside the target (issue #19). A device field is None while the
    planner decides it, a device name, or "none" for host memory."""

    draft: str | None = None          # the drafter GGUF (llama.cpp -md)
    draft_device: str | None = None   # -devd; the planner's default: the device with the target's last layers
    draft_cache_type: str = "f16"     # -ctkd / -ctvd
    draft_max: int = 3                # --spec-draft-n-max (llama.cpp's default)
    spec_type: str = "draft-simple"   # --spec-type: without one llama-server loads the drafter and never drafts
    mmproj: str | None = None         # -mm
    mmproj_device: str | None = None  # -mmdev; "none": --no-mmproj-offload
    loras: tuple[str, ...] = ()       # --lora
    # mtp: draft with the target's own MTP block (--spec-type draft-mtp without -md); draft_cache_type and
    # draft_max apply to its context
    mtp: bool = False

    @property
    def any(self) -> bool:
        return bool(self.draft or self.mmproj or self.loras or self.mtp)


@dataclass(frozen=True)
class PlanRequest:
    """What the user asks for; every field has llama.cpp's default where it has one."""

    n_ctx: int | None = None        # None: the training context (llama.cpp's -c 0)
    max_ctx: bool = False           # search the largest context that fits (--ctx max)
    n_parallel: int = 1
    objective: Objective = Objective.THROUGHPUT
    cache_types: tuple[str, ...] = ("f16",)   # tried in order until one fits
    n_ubatch: int | None = None     # None: 512, or smaller when that lets more layers onto devices
    flash_attn: str = "auto"
    allow_expert_offload: bool = True
    allow_output_on_host: bool = True
    op_offload: bool | None = None  # None: the planner chooses; True/False: llama.cpp's --op-offload/--no-op-offload
    solver: Solver = Solver.DP      # DP (exact over contiguous ranges, fast) or MILP (PuLP)
    allow_ctx_above_train: bool = False  # --ctx max may go past the training context
    companions: Companions = Companions()   # drafter, projector, adapters placed with the target
    split_mode: str = "auto"        # auto: -sm tensor where it decodes faster than the layer split; layer: never

    def __post_init__(self) -> None:
        # the solver may come as its name ("milp"): one Solver from here on
        try:
            object.__setattr__(self, "solver", Solver(self.solver))
        except ValueError:
            raise BadInput(f"solver {self.solver!r}: expected one of {', '.join(s.value for s in Solver)}") from None


@dataclass(frozen=True)
class PlanResult:
    model_path: str
    header_sha256: str
    inventory: Inventory
    budgets: Budgets
    request: PlanRequest
    flags: LlamaFlags
    estimate: Estimate
    prediction: Prediction
    experts_on_host: frozenset[int]
    solve_rounds: int
    explain: tuple[str, ...] = field(default=())

    @property
    def n_ctx(self) -> int:
        return self.estimate.cparams.n_ctx

    def budget_of(self, row: str) -> int:
        if row in HOST_ROWS:
            return self.budgets.host_bytes
        if row == META_NAME:   # -sm tensor: the meta device holds what its members hold
            return sum(self.budgets.devices.get(m.name, 0) for m in self.estimate.meta_members)
        return self.budgets.devices.get(row, 0)

    def to_dict(self) -> dict[str, Any]:
        return plan_dict(self)

    def to_table(self) -> str:
        return plan_table(self)


def llama_argv(result: PlanResult) -> list[str]:
    """The llama.cpp flags of a plan, with the context, the slots, the split mode and `-fit off`
    spelled out (llama-server's defaults differ from llama-cli's: -np 4 and --fit on)."""
    argv = flags_to_argv(result.flags)
    if not has_flag("n_ctx", argv):
        argv[:0] = arg("n_ctx", result.flags.n_ctx)
    if not has_flag("n_parallel", argv):
        argv += arg("n_parallel", result.flags.n_parallel)
    if not has_flag("split_mode", argv) and result.estimate.n_layer_all and len(result.inventory.devices) > 1:
        argv += arg("split_mode", "layer")
    return argv


def plan_argv(result: PlanResult) -> list[str]:
    """The plan's argument vector for llama-server and llama-cli: `-m MODEL` and the flags."""
    return server_argv(result.model_path, llama_argv(result), result.flags.n_parallel)


def llama_bench(result: PlanResult) -> BenchArgv:
    """The plan as llama-bench arguments (planner.llama.commands.bench_argv)."""
    return bench_argv(result.model_path, result.flags, result.n_ctx)


def server_command(result: PlanResult) -> str:
    """The llama-server line, shell-quoted: bash runs it as printed."""
    return command_line(LLAMA_SERVER, plan_argv(result))


def bench_command(result: PlanResult) -> str | None:
    """The llama-bench line, shell-quoted; None when llama-bench cannot express the placement."""
    bench = llama_bench(result)
    return None if bench.argv is None else command_line(LLAMA_BENCH, bench.argv)


def plan_rows(result: PlanResult) -> list[dict[str, Any]]:
    """Per device what the process holds (the target and its companions) against the budget."""
    est = result.estimate
    layers = dict(est.layers)
    rows = []
    for d in est.totals:
        budget = result.budget_of(d.name)
        on = layers.get(device_of(d.name), ())
        rows.append({"name": d.name, "model_bytes": d.model_bytes, "context_bytes": d.context_bytes,
                     "compute_bytes": d.compute_bytes, "total_bytes": d.total_bytes,
                     "overhead_bytes": d.overhead_bytes,
                     "budget_bytes": budget if d.name != CPU_REPACK else None,
                     "layers": [i for i in on if i < est.n_layer_all],
                     "output_layer": est.n_layer_all in on})
    return rows


def plan_predicted(result: PlanResult) -> dict[str, Any]:
    p = result.prediction
    return {"decode_tokens_s": round(p.decode_tokens_s, 2), "prefill_tokens_s": round(p.prefill_tokens_s, 2),
            "assumed_rates": p.assumed_rates, "rate_sources": list(p.rate_sources),
            "boundaries_per_token": p.n_boundaries}


def plan_commands(result: PlanResult) -> dict[str, Any]:
    """The plan's commands as the JSON and the deployment document carry them: `flags` (a string, as
    before, for existing readers), `argv` (what readers use), and the llama-bench arguments."""
    bench = llama_bench(result)
    return {"flags": " ".join(llama_argv(result)), "argv": plan_argv(result),
            "llama_bench_flags": "" if bench.argv is None else " ".join(bench.argv),
            "llama_bench_argv": None if bench.argv is None else list(bench.argv), "llama_bench_note": bench.note}


def plan_dict(result: PlanResult) -> dict[str, Any]:
    return {
        "model": result.model_path,
        "header_sha256": result.header_sha256,
        **plan_commands(result),
        "ctx": result.n_ctx,
        "n_parallel": result.flags.n_parallel,
        "cache_type": result.flags.cache_type_k,
        "objective": result.request.objective.value,
        "devices": plan_rows(result),
        "experts_on_host": sorted(result.experts_on_host),
        "predicted": plan_predicted(result),
        "compute_model": result.estimate.compute_model,
        "program": result.estimate.program.value,
        "notes": list(result.estimate.notes),
        "compute_safety": dict(result.estimate.compute_safety),
        "overheads": overhead_dict(result.estimate.overheads),
        "decode_splits": result.estimate.decode_splits or None,
        "explain": list(result.explain),
        **({"companions": [companion_dict(c) for c in result.estimate.companions]}
           if result.estimate.companions else {}),
    }


def windows_note(result: PlanResult) -> list[str]:
    """On Windows the CUDA driver spills past the card's memory into shared system memory instead of failing (the
    NVIDIA driver's "CUDA - Sysmem Fallback Policy"): a plan that overruns runs slowly rather than stopping. Says
    so for a plan with CUDA devices, with what the plan leaves free on each."""
    held = {d.name: d.held_bytes for d in result.estimate.totals}
    cuda = [d for d in result.inventory.devices if d.backend is Backend.CUDA and d.name in held]
    if not cuda:
        return []
    left = ", ".join(f"{d.name} {fmt_mib(max(0, d.free_bytes - held[d.name]))} MiB" for d in cuda)
    return [f"on Windows, CUDA allocations past a card's memory spill into shared system memory (slow, not an "
            f"out-of-memory error) unless the driver's CUDA Sysmem Fallback Policy is 'Prefer No Sysmem Fallback'; "
            f"this plan leaves free: {left}"]


def _headroom(budget: int | None, total: int) -> str:
    if budget is None:
        return "-"
    return fmt_mib(budget - total) if budget >= total else "-" + fmt_mib(total - budget)


def plan_table(result: PlanResult) -> str:
    rows = []
    for r in plan_rows(result):
        budget = r["budget_bytes"]
        rows.append([r["name"], fmt_mib(r["model_bytes"]), fmt_mib(r["context_bytes"]), fmt_mib(r["compute_bytes"]),
                     fmt_mib(r["total_bytes"]), fmt_mib(r["overhead_bytes"]),
                     "-" if budget is None else fmt_mib(budget),
                     _headroom(budget, r["total_bytes"] + r["overhead_bytes"]),
                     layer_ranges(r["layers"], output=r["output_layer"]) or "-"])
    p = result.prediction
    bench = llama_bench(result)
    lines = [
        f"{result.model_path}: context {result.n_ctx}, {result.flags.n_parallel} slot(s), "
        f"KV {result.flags.cache_type_k}, objective {result.request.objective.value}",
        "",
        table(["device", "model MiB", "context MiB", "compute MiB", "total MiB", "overhead MiB", "budget MiB",
               "headroom MiB", "layers"], rows, align="lrrrrrrrl"),
        "",
        f"predicted: decode {p.decode_tokens_s:.1f} tokens/s, prefill {p.prefill_tokens_s:.0f} tokens/s"
        + (" (calibrated rates)" if p.calibrated else "")
        + (" (some device rates unknown: assumed figures used)" if p.assumed_rates else ""),
        "",
        "run it (each command is one shell line, quoted for bash):",
        "  " + server_command(result),
        "measure it:",
        "  " + (bench_command(result) or "# " + bench.note),
    ]
    if bench.argv is not None and bench.note:
        lines.append(f"  # {bench.note}")
    if result.estimate.companions:
        lines[3:3] = ["", "of which companions (loaded beside the target):"] + [
            f"  {COMPANION_TITLES[c.kind]} {c.path}: "
            + ", ".join(f"{d.name} {fmt_mib(d.total_bytes)} MiB" for d in c.devices if d.total_bytes)
            for c in result.estimate.companions]
    if result.estimate.compute_model != SIMULATED:
        lines += ["", compute_note(result.estimate.compute_model, result.estimate.model_arch,
                                   result.estimate.compute_safety)]
    if result.estimate.notes:
        lines += ["", *result.estimate.notes]
    if result.estimate.decode_splits or result.estimate.overheads:
        lines.append("")
    lines += split_note(result.estimate)
    if result.estimate.overheads:
        lines += [*overhead_notes(result.estimate.overheads),
                  "headroom is the budget less total and overhead (the budget's default leaves the device margin "
                  "free beyond both)", *windows_note(result)]
    if result.explain:
        lines += ["", "why:"] + [f"  {line}" for line in result.explain]
    return "\n".join(lines) + "\n"
