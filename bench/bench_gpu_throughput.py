"""The throughput model on a real GPU: the llama-bench rows a device record keeps (`speed`, measured by
scripts/gpu_peer.sh measure on the lent GPU) against fitplan's predictions.

    python -m bench.bench_gpu_throughput [--record tests/peer/data/cuda/nvidia-h200.json]

Each recorded row is one llama-bench process (pp512 and tg32, three repeats) of a placement listed in
scripts/gpu_peer.py SPEED before the GPU ran. Here each is predicted through the path a plan takes
(fitplan's estimate of the flags, then planner/planning/throughput.py) from the record's inventory with the
catalog's figures of the GPU it names (configs/catalog.yaml, matched on the name nvidia-smi printed) and,
for the host, the figures below when given (--host-bandwidth, --host-flops) or the assumptions. Prints, per
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from bench.ranks import spearman
from planner.checking.llama_bench import Workload, placement_views, timing_of_rows
from planner.hardware import catalog
from planner.hardware.inventory import Inventory
from planner.hardware.inventory_yaml import load_inventory
from planner.llama.context import ModelContext, model_context
from planner.llama.flags import parse_llama_flags
from planner.llama.placement import CPU
from planner.model.costs import CostTable, cost_table
from planner.planning.throughput import Prediction, decode_bytes, predict
from runtime.engine.runner import ModelRunner
from scripts.gpu_peer import write_models

RECORD = Path(__file__).resolve().parents[1] / "tests" / "peer" / "data" / "cuda" / "nvidia-h200.json"


@dataclass(frozen=True)
class SpeedRow:
    """One recorded llama-bench process beside the prediction of its placement."""

    name: str
    full_offload: bool          # one device holds every layer (-ngl 99, no -ot, one device)
    gpu_bytes: int              # weights and cache one decoded token reads on the GPU (the model's figure)
    tg_nodes: int               # nodes of the one-token graph (the runtime's, as llama.cpp logs "graph: nodes")
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
        out.append(SpeedRow(name, full, gpu, tg_nodes(ctx, flags, inventory, work, row["rpc"]),
                            timing.tg_tokens_s, timing.pp_tokens_s,
                            predict(ctx.facts, costs, views.decode, inventory),
                            predict(ctx.facts, costs, views.prefill, inventory)))
    return out


def tg_nodes(ctx: ModelContext, flags: list[str], inventory: Inventory, work: Workload, rpc: list[str]) -> int:
    """The one-token graph's node count for the placement (the runtime's reserve, sizes only)."""
    n_ctx = max(work.n_depth + max(work.n_prompt, work.n_gen), 256)
    parsed = parse_llama_flags([*flags, *(["--rpc", ",".join(rpc)] if rpc else []), "-c", str(n_ctx)])
    runner = ModelRunner.load(ctx, parsed, inventory, weights=False)
    assert runner.reserve_report is not None
    return runner.reserve_report.n_nodes_tg


def node_fit(rows: list[SpeedRow]) -> list[str]:
    """What the record says the decode model lacks on this GPU: over the rows with every layer on the GPU,
    the least-squares fit of seconds per token = bytes read / B + graph nodes x T (B an effective bandwidth,
    T a time per node), and each such row's residual. The throughput model has the first term only, at the
    catalog's bandwidth."""
    full = [r for r in rows if r.full_offload]
    if len(full) < 3:
        return []
    a = np.array([[r.gpu_bytes, r.tg_nodes] for r in full], dtype=float)
    t = np.array([1.0 / r.tg_measured for r in full])
    (inv_bw, per_node), *_ = np.linalg.lstsq(a, t, rcond=None)
    lines = [f"decode with every layer on the GPU ({len(full)} rows): seconds per token = bytes / B + nodes x T "
             f"fits B = {1 / inv_bw / 1e12:.2f} TB/s (catalog {_catalog_bw(rows)}), T = {per_node * 1e6:.2f} us a "
             "graph node:"]
    for r, (b, n) in zip(full, a, strict=True):
        fitted = 1.0 / (b * inv_bw + n * per_node)
        lines.append(f"  {r.name:<58} {r.tg_measured:7.1f} tokens/s, fit {fitted:7.1f} "
                     f"({(fitted - r.tg_measured) / r.tg_measured:+.1%}); {b / 2**20:7.0f} MiB, {int(n)} nodes, "
                     f"nodes {n * per_node / (b * inv_bw + n * per_node):.0%} of the time")
    return lines


def _catalog_bw(rows: list[SpeedRow]) -> str:
    stage = next((s for r in rows for s in r.decode.stages if s.device != CPU), None)
    if stage is None or not stage.seconds_per_token:
        return "?"
    return f"{stage.bytes_per_token / stage.seconds_per_token / 1e12:.2f} TB/s"


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", type=Path, default=RECORD)
    ap.add_argument("--host-bandwidth-gbs", type=float, help="the GPU machine's host memory bandwidth (else assumed)")
    ap.add_argument("--host-fp16-tflops", type=float, help="its host FLOP/s (else assumed)")
    args = ap.parse_args(argv)
    record = json.loads(args.record.read_text())
    if not record.get("speed"):
        print(f"{args.record}: no speed rows", file=sys.stderr)
        return 2
    host = {k: v for k, v in (("bandwidth_gbs", args.host_bandwidth_gbs), ("fp16_tflops", args.host_fp16_tflops)) if v}
    gpu = (record.get("gpu") or {}).get("name", "")
    with tempfile.TemporaryDirectory() as tmp:
        models = write_models(Path(tmp) / "models", random_gemma=False)
        inventories = {}
        for topology, doc in record["inventory"].items():
            path = Path(tmp) / f"{topology}.yaml"
            path.write_text(yaml.safe_dump(with_catalog(doc, gpu, host)))
            inventories[topology] = load_inventory(path)
        rows = compare(record, models, inventories)
    print(f"{args.record.name}: {gpu or record['backend']}, llama-bench pp512/tg32 x3, one process a placement")
    for r in rows:
        print(f"  {r.name:<58} tg {r.tg_measured:8.1f} (pred {r.decode.decode_tokens_s:8.1f}, {r.tg_error:6.1%})  "
              f"pp {r.pp_measured:9.1f} (pred {r.prefill.prefill_tokens_s:9.1f}, {r.pp_error:6.1%})  "
              f"rates {'/'.join(r.decode.rate_sources)}")
    for line in summary(rows) + node_fit(rows):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
