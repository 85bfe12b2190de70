"""What an infeasible answer costs: per case, the first (failed) plan, then the
what-would-fit search (least budgets to the MiB, the largest context), which must add at most 2 s.

    python -m bench.bench_what_fits [--runs N]

The ten cases are tests/planner/search/test_what_fits.py's (sparse shape GGUFs in a temporary
folder). Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

from planner.core.errors import InfeasiblePlacement
from planner.hardware.budgets import resolve_budgets
from planner.llama.context import model_context
from planner.registry.examples import resolve_model
from planner.search.problem import PROBE_CACHE
from planner.search.result import PlanRequest
from planner.search.search import plan
from planner.synth.shapes_common import write_shape
from tests.planner.search.test_what_fits import CASES


def _seconds(ctx, inventory, request, budgets, what_would_fit: bool) -> float:
    PROBE_CACHE.clear()   # as a fresh `fitplan plan` process finds it
    start = time.perf_counter()
    with contextlib.suppress(InfeasiblePlacement):
        plan(ctx, inventory, request, budgets=budgets, what_would_fit=what_would_fit)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    print(f"{'model':<18} {'first plan s':>12} {'with search s':>13} {'search adds s':>13}  least budgets")
    with tempfile.TemporaryDirectory() as tmp:
        for name, inventory, max_vram, ram, n_ctx in CASES:
            path = resolve_model("example:gemma3-270m") if name == "gemma3-270m" else str(write_shape(name, Path(tmp)))
            ctx = model_context(path)
            budgets, request = resolve_budgets(inventory, max_vram, ram), PlanRequest(n_ctx=n_ctx)
            first = statistics.median(_seconds(ctx, inventory, request, budgets, False) for _ in range(runs))
            whole = statistics.median(_seconds(ctx, inventory, request, budgets, True) for _ in range(runs))
            try:
                plan(ctx, inventory, request, budgets=budgets, what_would_fit=True)
            except InfeasiblePlacement as e:
                least = ", ".join(f"{s.device} {s.need_bytes // 2**20} MiB" for s in e.shortfalls)
            print(f"{name:<18} {first:>12.2f} {whole:>13.2f} {whole - first:>13.2f}  {least}")


if __name__ == "__main__":
    main()
