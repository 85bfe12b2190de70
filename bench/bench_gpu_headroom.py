"""The headroom plans leave on consumer GPUs: issue 42's 48-plan matrix, re-made.

    python -m bench.bench_gpu_headroom [--only rtx3060] [--model gemma3-27b]

Four consumer cards from the catalog (`--device CUDA0=<id> --ram 64GiB`) x six held-out models
(planner/synth/shapes_consumer.py: Llama-3.1-8B, Qwen3-30B-A3B, gpt-oss-20b, Gemma-3-27B, Mistral-Nemo-12B,
Qwen2.5-14B, Q4_K_M-like / MXFP4, written sparse) x `--ctx max` and 32768. Each plan is made with the default
budgets; the bench prints, per plan, the GPU row's total (model + context + compute), its overhead, and what is
left of the card's free memory after both, and the least of those. With the overhead counted inside the budget,
every plan leaves at least overhead + the default margin (planner/hardware/budgets.py). A plan that does not fit
at all (a model too large for the card at that context) is listed as infeasible. Asserts nothing
(tests/bench/test_gpu_headroom.py asserts the bound).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from planner.api import plan
from planner.core.errors import InfeasiblePlacement
from planner.core.units import MiB
from planner.hardware.budgets import DEFAULT_DEVICE_MARGIN
from planner.synth.shapes_consumer import CONSUMER_SHAPES, write_consumer_shape

CARDS = ("rtx3060", "rtx4060ti-16gb", "rtx3090", "rtx4090")
CONTEXTS: tuple[int | None, ...] = (None, 32768)   # None: --ctx max
GPU = "CUDA0"


@dataclass(frozen=True)
class Cell:
    card: str
    model: str
    ctx: int | None           # as asked (None: --ctx max)
    n_ctx: int                # as planned (0: infeasible)
    free_bytes: int
    total_bytes: int          # the GPU row: model + context + compute
    overhead_bytes: int

    @property
    def left_bytes(self) -> int:
        """The card's free memory the plan leaves unused, beyond its rows and their overhead."""
        return self.free_bytes - self.total_bytes - self.overhead_bytes


def plan_cell(path: Path, card: str, model: str, ctx: int | None) -> Cell:
    fields = {"max_ctx": True} if ctx is None else {"n_ctx": ctx}
    try:
        result = plan(str(path), devices=[f"{GPU}={card}"], ram="64GiB", **fields)
    except InfeasiblePlacement:
        return Cell(card, model, ctx, 0, 0, 0, 0)
    row = next(d for d in result.estimate.totals if d.name == GPU)
    free = result.inventory.get(GPU).free_bytes
    return Cell(card, model, ctx, result.n_ctx, free, row.total_bytes, row.overhead_bytes)


def matrix(directory: Path, cards: tuple[str, ...] = CARDS, models: tuple[str, ...] = tuple(CONSUMER_SHAPES),
           contexts: tuple[int | None, ...] = CONTEXTS) -> list[Cell]:
    paths = {m: write_consumer_shape(m, directory) for m in models}
    return [plan_cell(paths[m], card, m, ctx) for card in cards for m in models for ctx in contexts]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=CARDS, help="one card")
    parser.add_argument("--model", choices=tuple(CONSUMER_SHAPES), help="one model")
    args = parser.parse_args(argv)
    cards = (args.only,) if args.only else CARDS
    models = (args.model,) if args.model else tuple(CONSUMER_SHAPES)
    with tempfile.TemporaryDirectory(prefix="fitplan-headroom-") as tmp:
        cells = matrix(Path(tmp), cards, models)
    print(f"{'card':15} {'model':17} {'ctx':>6} {'planned':>8} {'total MiB':>10} {'overhead':>9} {'left MiB':>9}")
    for c in cells:
        asked = "max" if c.ctx is None else str(c.ctx)
        if not c.n_ctx:
            print(f"{c.card:15} {c.model:17} {asked:>6} {'does not fit':>8}")
            continue
        print(f"{c.card:15} {c.model:17} {asked:>6} {c.n_ctx:>8} {c.total_bytes / MiB:>10.0f} "
              f"{c.overhead_bytes / MiB:>9.0f} {c.left_bytes / MiB:>9.0f}")
    planned = [c for c in cells if c.n_ctx]
    if planned:
        least = min(planned, key=lambda c: c.left_bytes)
        print(f"\n{len(planned)} of {len(cells)} plans; the least left beyond overhead: "
              f"{least.left_bytes / MiB:.0f} MiB "
              f"({least.card} {least.model} ctx {least.n_ctx}); the default margin is "
              f"{DEFAULT_DEVICE_MARGIN / MiB:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
