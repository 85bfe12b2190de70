"""Regenerate the pictures the docs show (docs/img/), from the bundled example model and a shape-faithful header.

    python -m scripts.docs_figures [--out DIR] [sweep plan report tensor-vs-layer]

With no names it draws all four:
- sweep.png, plan.png: drawn by the printed `fitplan` command, run in this process (planner.cli.main), so the
  script works where the console script is not on PATH (needs the `plots` extra).
- report.png: the HTML report of the two-GPU example, screenshotted by headless Chromium (Debian's `chromium`)
  with every network feature off.
- tensor-vs-layer.png: predicted decode of a layer split and of `-sm tensor` against the link between two
  RTX 3090-class cards (936 GB/s, 71 TFLOPS fp16, the catalog's figures) holding a Llama-3.1-8B-class Q4_K_M
  (a shape-faithful sparse file, planner/synth/shapes_common.py) at -c 8192. The layer split is `search.plan` with
  split_mode="layer", the tensor split `tensor_plan.tensor_option` on the same devices: two AllReduces a layer
  over the link (planner/speed/tensor_throughput.py) against one crossing a token. Predictions only: no GPU.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from planner.cli import main as fitplan
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.llama.context import model_context
from planner.search.result import PlanRequest
from planner.search.search import plan
from planner.search.tensor_plan import tensor_option
from planner.sweeps.plots import require_matplotlib
from planner.synth.shapes_common import write_shape

ROOT = Path(__file__).resolve().parents[1]
MODEL = "example:gemma3-270m"
GIB = 1 << 30

SWEEP = ["sweep", MODEL, "--device", "CUDA0=1536MiB", "--vary", "ctx=4096..131072",
         "--vary", "cache=f16,q8_0,q4_0"]
PLAN = ["plan", MODEL, "--device", "CUDA0=1GiB", "--device", "CUDA1=1GiB", "--ram", "16GiB", "-c", "131072"]
# the two-GPU example of the docs
REPORT = ["plan", MODEL, "--devices", "configs/devices/workstation-2x3090.yaml"]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--window-size=1100,1950"]

LINKS_GB_S = (0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)
PLANNING_HOST = HostSpec(64 * GIB, 60 * GIB, int(60e9), "planning host", int(1e12))


def _run_fitplan(argv: list[str]) -> None:
    print("fitplan " + " ".join(argv))
    if fitplan(argv) != 0:
        raise SystemExit(f"fitplan {argv[0]} failed")


def sweep_figure(out: Path) -> None:
    _run_fitplan(SWEEP + ["-o", str(out.with_suffix(".csv")), "--plot", str(out)])
    out.with_suffix(".csv").unlink()   # the docs show the picture, not the table


def plan_figure(out: Path) -> None:
    _run_fitplan(PLAN + ["--plot", str(out)])


def report_figure(out: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("the report's screenshot needs chromium (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "plan.html"
        _run_fitplan(REPORT + ["--html", str(page)])
        subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={Path(tmp) / 'profile'}",
                        f"--screenshot={out}", page.as_uri()], check=True, capture_output=True, timeout=120, cwd=tmp)


def _card(name: str, link: float) -> DeviceSpec:
    return DeviceSpec(name, DeviceKind.GPU, Backend.CUDA, 24 * GIB, 24 * GIB, int(936e9), int(71e12), int(link))


def link_predictions(model: Path) -> list[tuple[float, float, float]]:
    """(link GB/s, layer-split decode tokens/s, tensor-split decode tokens/s) per link figure."""
    ctx = model_context(str(model))
    out = []
    for gb_s in LINKS_GB_S:
        inv = Inventory((_card("CUDA0", gb_s * 1e9), _card("CUDA1", gb_s * 1e9)), PLANNING_HOST)
        layer = plan(ctx, inv, PlanRequest(n_ctx=8192, split_mode="layer"))
        option = tensor_option(ctx, inv, layer.budgets, layer.flags)
        tensor = option.prediction.decode_tokens_s if option.prediction and option.fits else float("nan")
        out.append((gb_s, layer.prediction.decode_tokens_s, tensor))
    return out


def tensor_vs_layer_figure(out: Path) -> None:
    require_matplotlib()
    from matplotlib.figure import Figure  # the plots extra: imported once it is known to be there
    with tempfile.TemporaryDirectory() as tmp:
        rows = link_predictions(write_shape("llama-8b", Path(tmp)))
    print(f"{'link GB/s':>10} {'-sm layer tok/s':>16} {'-sm tensor tok/s':>17}")
    for gb_s, layer, tensor in rows:
        print(f"{gb_s:>10g} {layer:>16.1f} {tensor:>17.1f}")
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    ax.plot([r[0] for r in rows], [r[1] for r in rows], marker="o", label="-sm layer")
    ax.plot([r[0] for r in rows], [r[2] for r in rows], marker="s", label="-sm tensor")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("link between the two cards (GB/s)")
    ax.set_ylabel("predicted decode (tokens/s)")
    ax.set_title("Llama-3.1-8B-class Q4_K_M, two 936 GB/s cards, -c 8192 (predicted)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.savefig(out, dpi=110)


FIGURES: dict[str, Callable[[Path], None]] = {
    "sweep": sweep_figure, "plan": plan_figure, "report": report_figure, "tensor-vs-layer": tensor_vs_layer_figure,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="where the PNGs go (docs/img)")
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"which pictures ({', '.join(FIGURES)}; default all)")
    args = ap.parse_args()
    unknown = [n for n in args.names if n not in FIGURES]
    if unknown:
        ap.error(f"no picture named {', '.join(unknown)} (known: {', '.join(FIGURES)})")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or list(FIGURES):
        out = args.out / f"{name}.png"
        start = time.perf_counter()
        FIGURES[name](out)
        print(f"  -> {out} ({out.stat().st_size} bytes, {time.perf_counter() - start:.2f} s)")


if __name__ == "__main__":
    main()
