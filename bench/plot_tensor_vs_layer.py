"""Predicted decode speed of a layer split and a tensor split against the link between two equal GPUs.

    python -m bench.plot_tensor_vs_layer [OUT.png]

Two RTX 3090-class cards (936 GB/s, 71 TFLOPS fp16, as the catalog lists them) hold a
Llama-3.1-8B-class Q4_K_M model (a shape-faithful sparse file, planner/synth/shapes.py) at -c 8192.
For each link bandwidth the planner plans the layer split (PlanRequest split_mode="layer") and weighs
`-sm tensor` on the same devices (planner/planning/tensor_plan.py); both predictions are printed
and drawn. The tensor split pays two AllReduces per layer over the link plus a hand-off latency each
(planner/planning/tensor_throughput.py); the layer split crosses the link once per token. These are
the throughput model's predictions, not measurements: no GPU was used.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.llama.context import model_context
from planner.planning.result import PlanRequest
from planner.planning.search import plan
from planner.planning.tensor_plan import tensor_option
from planner.sweeps.plots import require_matplotlib
from planner.synth.shapes import write_shape

GIB = 1 << 30
LINKS_GB_S = (0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)
HOST = HostSpec(64 * GIB, 60 * GIB, int(60e9), "planning host", int(1e12))


def _card(name: str, link: float) -> DeviceSpec:
    return DeviceSpec(name, DeviceKind.GPU, Backend.CUDA, 24 * GIB, 24 * GIB, int(936e9), int(71e12), int(link))


def predictions(model: Path) -> list[tuple[float, float, float]]:
    """(link GB/s, layer-split decode tokens/s, tensor-split decode tokens/s) per link figure."""
    ctx = model_context(str(model))
    out = []
    for gb_s in LINKS_GB_S:
        inv = Inventory((_card("CUDA0", gb_s * 1e9), _card("CUDA1", gb_s * 1e9)), HOST)
        layer = plan(ctx, inv, PlanRequest(n_ctx=8192, split_mode="layer"))
        option = tensor_option(ctx, inv, layer.budgets, layer.flags)
        tensor = option.prediction.decode_tokens_s if option.prediction and option.fits else float("nan")
        out.append((gb_s, layer.prediction.decode_tokens_s, tensor))
    return out


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "docs" / "img" / "tensor-vs-layer.png"
    require_matplotlib()
    from matplotlib.figure import Figure  # the plots extra: imported once it is known to be there
    with tempfile.TemporaryDirectory() as tmp:
        rows = predictions(write_shape("llama-8b", Path(tmp)))
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
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
