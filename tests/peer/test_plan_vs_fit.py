"""`fitplan plan` head to head with llama.cpp's own `--fit` (`llama-fit-params`) on the same budgets.

Two ggml-rpc-servers on loopback are the devices (llama.cpp names them RPC0, RPC1). Each reports
this machine's RAM as its free memory, so a budget B is emulated for llama.cpp by its per-device
`--fit-target` margin (the MiB it must leave free): reported free − B. fitplan sees the same
devices (detected through `llama-cli --list-devices`, as `fitplan devices --rpc` does) with
`--max-vram RPC0=B,RPC1=B`. llama-cli prints free memory rounded down to the MiB, so llama.cpp's
own target is B plus the sub-MiB remainder: the comparison gives llama.cpp up to 1 MiB more room.
Host memory is not limited (llama.cpp's fit assumes unlimited system memory; fitplan gets 256 GiB).

For every case:
  * llama-fit-params picks a context (the training context unless the case sets -c), -ngl, -ts
    and -ot; `--fit-print on` with its flags gives its per-device projection;
  * fitplan plans with `--ctx max` (context objective) and at llama.cpp's context (throughput);
  * the `--ctx max` plan's context is at least llama.cpp's;
  * the plan at llama.cpp's context keeps at least as many bytes on the devices, where "bytes on
    the devices" means model weight bytes on RPC0 + RPC1 (the estimate's model column, which is
    checked here to equal llama-fit-params' printed model MiB for both plans);
  * both fitplan plans predict per-device totals (model + context + compute) within every budget,
    and llama.cpp's dry run of fitplan's flags (`--fit-print on`) confirms the model and context to
    the MiB. The plans' compute is what their llama-server line allocates (one row of logits per
    slot on the output device, planner/llama/programs.py; tests/peer/test_real_load_peer.py loads
    such plans), which the dry run, reserving a whole batch of logits, does not print.

bench/bench_plan_vs_fit.py prints the same matrix as a table.
"""
from __future__ import annotations

import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from planner.hardware.budgets import Budgets, fit_target_flag, fit_target_margins, resolve_budgets
from planner.hardware.inventory import Inventory
from planner.llama.context import model_context
from planner.llama.placement import CPU_REPACK
from planner.memory.estimate import estimate
from planner.running.tool_runs import fit_print
from planner.search.result import PlanRequest, PlanResult, llama_argv
from planner.search.search import plan
from planner.search.solve import Objective
from tests.support.estimate_matrix import model_path

pytestmark = pytest.mark.peer

MIB = 2**20
HOST_RAM = "256GiB"   # large enough never to bind: llama.cpp's fit does not limit system memory
DEVICES = ("RPC0", "RPC1")


@dataclass(frozen=True)
class Case:
    model: str                       # a name from tests/support/estimate_matrix.py MODELS
    budgets_mib: tuple[int, int]     # RPC0, RPC1
    n_ctx: int | None = None         # -c for both; None: llama.cpp's default (the training context)

    @property
    def label(self) -> str:
        b = "+".join(f"{m // 1024}G" if m % 1024 == 0 else f"{m}M" for m in self.budgets_mib)
        return f"{self.model} {b}" + (f" -c {self.n_ctx}" if self.n_ctx else "")


# Budgets that make each model's problem non-trivial: the small file at 100 MiB to 2 GiB per device
# (equal and unequal pairs), the larger shapes at a few GiB where part of the model must stay on
# the host.
CASES: tuple[Case, ...] = (
    Case("gemma3-270m", (100, 100)),
    Case("gemma3-270m", (256, 256)),
    Case("gemma3-270m", (512, 512)),
    Case("gemma3-270m", (1024, 1024)),
    Case("gemma3-270m", (2048, 2048)),
    Case("gemma3-270m", (2048, 512)),
    Case("gemma3-270m", (512, 256)),
    Case("gemma3-270m", (100, 1024)),
    Case("gemma3-270m", (256, 256), n_ctx=8192),
    Case("llama-8b", (2048, 2048)),
    Case("llama-8b", (1024, 1024)),
    Case("llama-8b", (4096, 1024)),
    Case("llama-8b", (512, 2048)),
    Case("qwen3moe-30b-a3b", (2048, 2048)),
    Case("qwen3moe-30b-a3b", (4096, 2048)),
    Case("qwen3moe-30b-a3b", (1024, 1024)),
    Case("qwen3moe-30b-a3b", (1024, 512)),
    Case("qwen3moe-30b-a3b", (2048, 2048), n_ctx=16384),
    Case("deepseek2-mla", (2048, 2048)),
    Case("deepseek2-mla", (4096, 4096)),
    Case("deepseek2-mla", (1024, 512)),
    Case("granite-hybrid", (100, 100)),
    Case("granite-hybrid", (512, 512)),
    Case("granite-hybrid", (1024, 256)),
    Case("granite-hybrid", (2048, 2048)),
)


@dataclass(frozen=True)
class Side:
    """One planner's choice on one case, as llama.cpp's dry run sees it."""

    argv: tuple[str, ...]                      # llama.cpp flags, without -m
    n_ctx: int
    n_gpu_layers: int
    device_model_bytes: int                    # weights on RPC0 + RPC1 (exact bytes, from the estimate)
    printed: dict[str, tuple[int, int, int]]   # llama-fit-params --fit-print on: MiB per row
    seconds: float                             # wall time of the planner that chose it

    def printed_total_mib(self, device: str) -> int:
        return sum(self.printed.get(device, (0, 0, 0)))

    def printed_weights_and_context_mib(self, device: str) -> int:
        return sum(self.printed.get(device, (0, 0, 0))[:2])


@dataclass(frozen=True)
class Outcome:
    case: Case
    budgets: Budgets
    llama: Side
    by_context: Side          # fitplan --ctx max
    at_llama_ctx: Side        # fitplan --ctx <llama.cpp's context>
    predicted: dict[str, dict[str, int]]   # plan -> device -> predicted total bytes


def setting(bin_dir: Path, endpoints: list[str], case: Case) -> tuple[Inventory, Budgets, list[str]]:
    """The detected inventory (host RAM made unlimited), fitplan's budgets, llama.cpp's --fit-target."""
    from planner.hardware.detect import detect_inventory
    from planner.hardware.inventory_yaml import apply_shorthands

    inventory = apply_shorthands([], HOST_RAM, detect_inventory(endpoints))
    max_vram = ",".join(f"{d}={mib}MiB" for d, mib in zip(DEVICES, case.budgets_mib, strict=True))
    budgets = resolve_budgets(inventory, max_vram)
    return inventory, budgets, fit_target_flag(fit_target_margins(inventory, budgets))


def same_budgets_from_capped_inventory(endpoints: list[str], case: Case) -> Budgets:
    """The other way to state the budgets: devices whose free memory is the budget, capped by name."""
    from planner.hardware.inventory_yaml import apply_shorthands

    specs = [f"{d}={mib}MiB@{ep}" for d, mib, ep in zip(DEVICES, case.budgets_mib, endpoints, strict=False)]
    inventory = apply_shorthands(specs, HOST_RAM, None)
    max_vram = ",".join(f"{d}={mib}MiB" for d, mib in zip(DEVICES, case.budgets_mib, strict=True))
    return resolve_budgets(inventory, max_vram)


def llama_fit(bin_dir: Path, model: Path, endpoints: list[str], fit_target: list[str],
              case: Case) -> tuple[list[str], float]:
    """llama-fit-params' chosen flags (it prints them as one line on stdout) and its wall time."""
    argv = ["--rpc", ",".join(endpoints), *fit_target] + (["-c", str(case.n_ctx)] if case.n_ctx else [])
    start = time.perf_counter()
    done = subprocess.run([str(bin_dir / "llama-fit-params"), "-m", str(model), *argv],
                          capture_output=True, text=True, timeout=600, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"llama-fit-params {' '.join(argv)} failed: {done.stderr.strip()[-500:]}")
    chosen = shlex.split([line for line in done.stdout.splitlines() if line.startswith("-c ")][-1])
    return ["--rpc", ",".join(endpoints), *_with_full_split(chosen, len(endpoints))], seconds


def _with_full_split(chosen: list[str], n_devices: int) -> list[str]:
    """llama-fit-params prints -ts without its trailing zero entries (tools/fit-params drops them),
    so a fit that put every layer on RPC0 prints no -ts at all and, run as printed, would split by
    free memory instead. Put the zeros back; -ngl -1 means the fit changed nothing (default split)
    and -ngl 0 needs no split."""
    ngl = int(chosen[chosen.index("-ngl") + 1])
    if ngl <= 0 or n_devices < 2:
        return chosen
    if "-ts" not in chosen:
        return chosen + ["-ts", ",".join([str(ngl)] + ["0"] * (n_devices - 1))]
    i = chosen.index("-ts") + 1
    parts = chosen[i].split(",")
    return chosen[:i] + [",".join(parts + ["0"] * (n_devices - len(parts)))] + chosen[i + 1:]


def _side(bin_dir: Path, model: Path, ctx, argv: list[str], seconds: float) -> Side:
    est = estimate(ctx, argv)
    printed = fit_print(bin_dir, model, argv)
    for d in est.devices:   # the bytes compared are llama.cpp's own model column, to the MiB
        if d.name != CPU_REPACK:
            assert d.model_bytes // MIB == printed[d.name][0], (d.name, argv)
    on_devices = sum(d.model_bytes for d in est.devices if d.name in DEVICES)
    return Side(tuple(argv), est.cparams.n_ctx, est.flags.n_gpu_layers, on_devices, printed, seconds)


def _fitplan(bin_dir: Path, model: Path, ctx, inventory: Inventory, budgets: Budgets,
             request: PlanRequest) -> tuple[Side, PlanResult]:
    start = time.perf_counter()
    result = plan(str(model), inventory, request, budgets=budgets)
    seconds = time.perf_counter() - start
    return _side(bin_dir, model, ctx, llama_argv(result), seconds), result


def run_case(bin_dir: Path, endpoints: list[str], case: Case, directory: Path) -> Outcome:
    model = model_path(case.model, directory)
    ctx = model_context(str(model))
    inventory, budgets, fit_target = setting(bin_dir, endpoints, case)
    argv, seconds = llama_fit(bin_dir, model, endpoints, fit_target, case)
    llama = _side(bin_dir, model, ctx, argv, seconds)
    by_context, r1 = _fitplan(bin_dir, model, ctx, inventory, budgets,
                              PlanRequest(n_ctx=case.n_ctx, max_ctx=True, objective=Objective.CONTEXT))
    at_llama_ctx, r2 = _fitplan(bin_dir, model, ctx, inventory, budgets,
                                PlanRequest(n_ctx=llama.n_ctx, objective=Objective.THROUGHPUT))
    predicted = {name: {d.name: d.total_bytes for d in r.estimate.devices if d.name in DEVICES}
                 for name, r in (("by_context", r1), ("at_llama_ctx", r2))}
    return Outcome(case, budgets, llama, by_context, at_llama_ctx, predicted)


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_plan_beats_llama_fit(llama_tools, rpc_endpoints, shapes_dir, case):
    out = run_case(llama_tools, rpc_endpoints, case, shapes_dir)
    budget_mib = dict(zip(DEVICES, case.budgets_mib, strict=True))
    assert out.budgets == same_budgets_from_capped_inventory(rpc_endpoints, case)
    assert out.budgets.devices == {d: mib * MIB for d, mib in budget_mib.items()}
    # llama.cpp's own choice stays within the targets it was given (plus the sub-MiB remainder).
    for d in DEVICES:
        assert out.llama.printed_total_mib(d) <= budget_mib[d], (d, out.llama.printed)
    assert out.by_context.n_ctx >= out.llama.n_ctx
    assert out.at_llama_ctx.n_ctx == out.llama.n_ctx
    assert out.at_llama_ctx.device_model_bytes >= out.llama.device_model_bytes
    for name, side in (("by_context", out.by_context), ("at_llama_ctx", out.at_llama_ctx)):
        for d in DEVICES:
            assert out.predicted[name].get(d, 0) <= out.budgets.devices[d], (name, d)
            assert side.printed_weights_and_context_mib(d) <= budget_mib[d], (name, d, side.printed, side.argv)
