"""Regenerate the pictures the README shows (docs/img/), from the bundled example model.

    python -m bench.make_readme_figures [OUT_DIR]

Each picture is drawn by the printed `fitplan` command, run in this process (planner.cli.main),
so the script works where the console script is not on PATH.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from planner.cli import main as fitplan

ROOT = Path(__file__).resolve().parents[1]
MODEL = "example:gemma3-270m"

SWEEP = ["sweep", MODEL, "--device", "CUDA0=1536MiB", "--vary", "ctx=4096..131072",
         "--vary", "cache=f16,q8_0,q4_0"]
PLAN = ["plan", MODEL, "--device", "CUDA0=1GiB", "--device", "CUDA1=1GiB", "--ram", "16GiB", "-c", "131072"]


def sweep_figure(out: Path) -> None:
    argv = SWEEP + ["-o", str(out.with_suffix(".csv")), "--plot", str(out)]
    print("fitplan " + " ".join(argv))
    if fitplan(argv) != 0:
        raise SystemExit("the sweep failed")
    out.with_suffix(".csv").unlink()   # the README shows the picture, not the table


def plan_figure(out: Path) -> None:
    argv = PLAN + ["--plot", str(out)]
    print("fitplan " + " ".join(argv))
    if fitplan(argv) != 0:
        raise SystemExit("the plan failed")


def main() -> None:
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "img"
    out_dir.mkdir(parents=True, exist_ok=True)
    for make, name in ((sweep_figure, "sweep.png"), (plan_figure, "plan.png")):
        start = time.perf_counter()
        make(out_dir / name)
        print(f"  -> {out_dir / name} ({(out_dir / name).stat().st_size} bytes, {time.perf_counter() - start:.2f} s)")


if __name__ == "__main__":
    main()
