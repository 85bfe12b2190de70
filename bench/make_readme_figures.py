"""Regenerate the pictures the README shows (docs/img/), from the bundled example model.

    python -m bench.make_readme_figures [OUT_DIR]

Each picture is drawn by the printed `fitplan` command, run in this process (planner.cli.main),
so the script works where the console script is not on PATH. The HTML report's screenshot is taken
by headless Chromium (Debian's `chromium`), with every network feature off.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from planner.cli import main as fitplan

ROOT = Path(__file__).resolve().parents[1]
MODEL = "example:gemma3-270m"

SWEEP = ["sweep", MODEL, "--device", "CUDA0=1536MiB", "--vary", "ctx=4096..131072",
         "--vary", "cache=f16,q8_0,q4_0"]
PLAN = ["plan", MODEL, "--device", "CUDA0=1GiB", "--device", "CUDA1=1GiB", "--ram", "16GiB", "-c", "131072"]
# the README's two-GPU example
REPORT = ["plan", MODEL, "--devices", "configs/devices/workstation-2x3090.yaml"]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--window-size=1100,1950"]


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


def report_figure(out: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("the report's screenshot needs chromium (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "plan.html"
        argv = REPORT + ["--html", str(page)]
        print("fitplan " + " ".join(argv))
        if fitplan(argv) != 0:
            raise SystemExit("the plan failed")
        subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={Path(tmp) / 'profile'}",
                        f"--screenshot={out}", page.as_uri()], check=True, capture_output=True, timeout=120, cwd=tmp)


def main() -> None:
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "img"
    out_dir.mkdir(parents=True, exist_ok=True)
    for make, name in ((sweep_figure, "sweep.png"), (plan_figure, "plan.png"), (report_figure, "report.png")):
        start = time.perf_counter()
        make(out_dir / name)
        print(f"  -> {out_dir / name} ({(out_dir / name).stat().st_size} bytes, {time.perf_counter() - start:.2f} s)")


if __name__ == "__main__":
    main()
