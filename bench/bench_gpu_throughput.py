"""The throughput model on a real GPU: the llama-bench rows a device record keeps (`speed`, measured by
scripts/gpu_peer.sh measure on the lent GPU) against fitplan's predictions.

    python -m bench.bench_gpu_throughput [--record tests/peer/data/cuda/nvidia-h200.json]

Each recorded row is one llama-bench process (pp512 and tg32, three repeats) of a placement listed in
scripts/gpu_peer.py SPEED before the GPU ran. Here each is predicted through the path a plan takes
(fitplan's estimate of the flags, then planner/speed/throughput.py) from the record's inventory with the
catalog's figures of the GPU it names (configs/catalog.yaml, matched on the name nvidia-smi printed: the
datasheet's, and the `measured:` figures fitted here from this record — the decode streaming bandwidth and the
time per op node; `--datasheet` leaves those out, so the time per op node is the assumed one) and, for the host,
the figures below when given (--host-bandwidth, --host-flops) or the assumptions. Prints, per
placement, the measured and predicted tokens/s and the relative error, then the median relative error and
Spearman's rank correlation of decode and prefill and the worst placement of each. Asserts nothing; needs
no GPU (the models are written here sparse: the headers the GPU machine wrote, checked by their hash).
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import yaml

from bench.ranks import spearman
from planner.hardware import catalog
from planner.hardware.inventory import Inventory
from planner.hardware.inventory_yaml import load_inventory
from planner.llama.context import ModelContext, model_context
from planner.llama.placement import CPU
from planner.measuring.llama_bench import Workload, placement_views, timing_of_rows
from planner.model.costs import CostTable, cost_table
from planner.speed.throughput import Prediction, decode_bytes, predict
from scripts.gpu_peer import write_models

RECORD = Path(__file__).resolve().parents[1] / "tests" / "peer" / "data" / "cuda" / "nvidia-h200.json"


@dataclass(frozen=True)
class SpeedRow:
    """One recorded llama-bench process beside the prediction of its placement."""

    name: str
    full_offload: bool          # one device holds every layer (-ngl 99, no -ot, one device)
    gpu_bytes: int              # weights and cache one decoded token reads on the GPU (the model's figure)
    tg_kernels: int             # op nodes of the one-token graph on the GPU's devices (the estimate's reserve)
    tg_measured: float
    pp_measured: float
    decode: Prediction
    prefill: Prediction

    @property
    def tg_error(self) -> float:
        return abs(self.decode.decode_tokens_s - self.tg_measured) / self.tg_measured

    @property
    def pp_error(self) -> float:
        return abs(self.prefill.prefill_tokens_s - self.pp_measured) / self.pp_measured


def with_catalog(inventory_doc: dict, gpu_name: str, host: dict[str, float]) -> dict:
    """The record's inventory with the catalog entry of the measured GPU on every device that is that GPU
    (CUDA0, and the rpc-servers backed by it), and the host's stated figures."""
    doc = copy.deepcopy(inventory_doc)
    entry = catalog.match_description(gpu_name)
    for dev in doc["devices"]:
        if entry is not None and (dev.get("backend") == "CUDA" or dev.get("remote_backend") == "CUDA"):
            dev["catalog"] = entry.id
    doc["host"].update(host)
    return doc


@functools.cache
def _costs(path: str) -> tuple[ModelContext, CostTable]:
    ctx = model_context(path)
    return ctx, cost_table(ctx.model, ctx.facts)


def compare(record: dict, models: dict[str, Path], inventories: dict[str, Inventory]) -> list[SpeedRow]:
    out = []
    for row in record.get("speed", []):
        work = Workload(**row["workload"])
        flags = row["flags"].split()
        ctx, costs = _costs(str(models[row["model"]]))
        inventory = inventories[row["topology"]]
        views = placement_views(ctx, flags, inventory, work, row["rpc"])
        timing = timing_of_rows(row["bench"], flags, work.n_prompt)
        name = f"{row['model']} {row['flags']}" + (f" -d {work.n_depth}" if work.n_depth else "") + \
            (" (3 devices)" if row["rpc"] else "")
        weights, kv = decode_bytes(ctx.facts, costs, views.decode)
        gpu = sum(n for d, n in [*weights.items(), *kv.items()] if d != CPU)
        full = "-ot" not in flags and not row["rpc"] and flags[flags.index("-ngl") + 1] == "99"
        kernels = sum(n for d, n in views.decode.kernels if d != CPU)
        out.append(SpeedRow(name, full, gpu, kernels, timing.tg_tokens_s, timing.pp_tokens_s,
                            predict(ctx.facts, costs, views.decode, inventory),
                            predict(ctx.facts, costs, views.prefill, inventory)))
    return out


def node_fit(rows: list[SpeedRow], catalog_bw: float) -> list[str]:
    """The record's decode rows with every layer on the GPU against seconds per token = bytes read / B + op nodes
    x T: the least-squares fit of both (B an effective bandwidth, T a time per kernel-launching node; T is where
    throughput.FALLBACK_KERNEL_S comes from), and of T alone with B at the catalog's bandwidth, as the throughput
    model predicts; each row's residual under the joint fit."""
    full = [r for r in rows if r.full_offload]
    if len(full) < 3:
        return []
    a = np.array([[r.gpu_bytes, r.tg_kernels] for r in full], dtype=float)
    t = np.array([1.0 / r.tg_measured for r in full])
    (inv_bw, per_node), *_ = np.linalg.lstsq(a, t, rcond=None)
    lines = [f"decode with every layer on the GPU ({len(full)} rows): seconds per token = bytes / B + op nodes x T "
             f"fits B = {1 / inv_bw / 1e12:.2f} TB/s, T = {per_node * 1e6:.2f} us an op node"
             + (f"; with B at the datasheet's {catalog_bw / 1e12:.2f} TB/s, T = "
                f"{np.linalg.lstsq(a[:, 1:], t - a[:, 0] / catalog_bw, rcond=None)[0][0] * 1e6:.2f} us" if catalog_bw
                else "") + ":"]
    for r, (b, n) in zip(full, a, strict=True):
        fitted = 1.0 / (b * inv_bw + n * per_node)
        lines.append(f"  {r.name:<58} {r.tg_measured:7.1f} tokens/s, fit {fitted:7.1f} "
                     f"({(fitted - r.tg_measured) / r.tg_measured:+.1%}); {b / 2**20:7.0f} MiB, {int(n)} op nodes, "
                     f"nodes {n * per_node / (b * inv_bw + n * per_node):.0%} of the time")
    return lines


def summary(rows: list[SpeedRow]) -> list[str]:
    tg_rho = spearman([r.tg_measured for r in rows], [r.decode.decode_tokens_s for r in rows])
    pp_rho = spearman([r.pp_measured for r in rows], [r.prefill.prefill_tokens_s for r in rows])
    worst_tg = max(rows, key=lambda r: r.tg_error)
    worst_pp = max(rows, key=lambda r: r.pp_error)
    return [f"placements: {len(rows)}",
            f"decode:  median relative error {statistics.median(r.tg_error for r in rows):.1%}, Spearman {tg_rho:.3f}; "
            f"worst {worst_tg.name} ({worst_tg.tg_error:.0%})",
            f"prefill: median relative error {statistics.median(r.pp_error for r in rows):.1%}, Spearman {pp_rho:.3f}; "
            f"worst {worst_pp.name} ({worst_pp.pp_error:.0%})"]


def record_rows(record: dict, host: dict[str, float] | None = None, datasheet: bool = False
                ) -> tuple[list[SpeedRow], dict[str, Inventory]]:
    """Every speed row of a record beside its prediction, and the inventories they were predicted on: the
    record's, with the catalog entry of the GPU it names (`datasheet`: without the entry's measured figures)."""
    gpu = (record.get("gpu") or {}).get("name", "")
    with tempfile.TemporaryDirectory() as tmp:
        models = write_models(Path(tmp) / "models", random_gemma=False)
        inventories = {}
        for topology, doc in record["inventory"].items():
            path = Path(tmp) / f"{topology}.yaml"
            path.write_text(yaml.safe_dump(with_catalog(doc, gpu, host or {})))
            inventory = load_inventory(path)
            if datasheet:
                inventory = replace(inventory, devices=tuple(replace(d, stream_bytes_s=0, kernel_seconds=0.0)
                                                             for d in inventory.devices))
            inventories[topology] = inventory
        return compare(record, models, inventories), inventories


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", type=Path, default=RECORD)
    ap.add_argument("--host-bandwidth-gbs", type=float, help="the GPU machine's host memory bandwidth (else assumed)")
    ap.add_argument("--host-fp16-tflops", type=float, help="its host FLOP/s (else assumed)")
    ap.add_argument("--datasheet", action="store_true", help="predict from the catalog's datasheet figures alone, "
                    "without its measured ones")
    args = ap.parse_args(argv)
    record = json.loads(args.record.read_text())
    if not record.get("speed"):
        print(f"{args.record}: no speed rows", file=sys.stderr)
        return 2
    host = {k: v for k, v in (("bandwidth_gbs", args.host_bandwidth_gbs), ("fp16_tflops", args.host_fp16_tflops)) if v}
    gpu = (record.get("gpu") or {}).get("name", "")
    rows, inventories = record_rows(record, host, args.datasheet)
    print(f"{args.record.name}: {gpu or record['backend']}, llama-bench pp512/tg32 x3, one process a placement")
    for r in rows:
        print(f"  {r.name:<58} tg {r.tg_measured:8.1f} (pred {r.decode.decode_tokens_s:8.1f}, {r.tg_error:6.1%})  "
              f"pp {r.pp_measured:9.1f} (pred {r.prefill.prefill_tokens_s:9.1f}, {r.pp_error:6.1%})  "
              f"rates {'/'.join(r.decode.rate_sources)}")
    gpu0 = inventories["one"].get("CUDA0")
    catalog_bw = float(gpu0.bandwidth_bytes_s) if gpu0 is not None and gpu0.bandwidth_bytes_s else 0.0
    for line in summary(rows) + node_fit(rows, catalog_bw):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
