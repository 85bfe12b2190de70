"""The GPU decode terms the H200 record asked for: a time per op node of the token's graph on devices that launch
a kernel for each (counted by the scheduler the estimate replays), and the bandwidth llama.cpp's decode was
measured to stream at on a catalog product. Figures worked out by hand here; the catalog's H200 figures checked
against the record they come from."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from planner.core.units import GiB
from planner.hardware import catalog
from planner.hardware.inventory import (
    Backend,
    CalibratedFigure,
    Calibration,
    DeviceKind,
    DeviceSpec,
    HostSpec,
    Inventory,
    Quantity,
)
from planner.hardware.inventory_yaml import inventory_from_cli, load_inventory
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.memory.estimate import estimate
from planner.model.costs import cost_table
from planner.registry.examples import resolve_model
from planner.speed.throughput import (
    ASSUMED,
    CALIBRATED,
    FALLBACK_KERNEL_S,
    STATED,
    PlacementView,
    Rates,
    predict,
    view_of_estimate,
)
from runtime.ggml.graph import VIEW_OPS, Op

HOST = HostSpec(64 * GiB, 64 * GiB, int(50e9), "host")
RECORD = Path(__file__).resolve().parents[2] / "peer" / "data" / "cuda" / "nvidia-h200.json"


def _cuda(name: str = "CUDA0", **kw) -> DeviceSpec:
    return DeviceSpec(name, DeviceKind.GPU, Backend.CUDA, 24 * GiB, 24 * GiB, int(1e12), int(1e14), 0, **kw)


def _rpc(backend: Backend | None) -> DeviceSpec:
    return DeviceSpec("RPC0", DeviceKind.RPC, Backend.RPC, 8 * GiB, 8 * GiB, int(1e11), 0, 0,
                      endpoint="127.0.0.1:50052", remote_backend=backend)


@pytest.fixture(scope="module")
def gemma():
    ctx = model_context(resolve_model("example:gemma3-270m"))
    return ctx, cost_table(ctx.model, ctx.facts)


def test_a_gpu_device_pays_its_kernel_time_for_every_op_node_and_the_host_none(gemma):
    ctx, costs = gemma
    n = ctx.facts.n_layer_all
    inv = Inventory((_cuda(),), HOST)
    on_gpu = PlacementView(tuple(["CUDA0"] * n), "CUDA0", frozenset(), 1024, n_past=0)
    plain = predict(ctx.facts, costs, on_gpu, inv)
    counted = predict(ctx.facts, costs, replace(on_gpu, kernels=(("CPU", 3), ("CUDA0", 500))), inv)
    # 500 nodes at the assumed 1.36 us each; the host's 3 (the embedding's get_rows) cost nothing beyond bytes
    assert 1 / counted.decode_tokens_s - 1 / plain.decode_tokens_s == pytest.approx(500 * 1.36e-6, rel=1e-9)
    assert ASSUMED in counted.rate_sources
    # the assumption is the one GPU where it was measured
    assert catalog.device("h200-sxm").kernel_seconds == pytest.approx(FALLBACK_KERNEL_S, rel=1e-12)
    gpu = next(s for s in counted.stages if s.device == "CUDA0")
    assert gpu.seconds_per_token == pytest.approx(gpu.bytes_per_token / 1e12 + 500 * 1.36e-6)


@pytest.mark.parametrize(("backend", "tau"), [(None, 0.0), (Backend.CPU, 0.0), (Backend.CUDA, 1.36e-6)])
def test_an_rpc_server_launches_kernels_only_when_it_runs_a_gpu_backend(backend, tau):
    assert Rates(Inventory((_rpc(backend),), HOST)).kernel_time("RPC0") == tau


def test_kernel_time_is_calibrated_over_measured_over_assumed():
    figures = (CalibratedFigure("CUDA1", Quantity.KERNEL_TIME, 4e-6, "by hand"),)
    inv = Inventory((_cuda("CUDA0", kernel_seconds=2e-6), _cuda("CUDA1", kernel_seconds=2e-6), _cuda("CUDA2")), HOST,
                    calibration=Calibration("2026-12-05T00:00:00+00:00", "by hand", "none", figures))
    rates = Rates(inv)
    assert rates.kernel_time("CUDA1") == 4e-6 and rates.sources == {CALIBRATED}
    assert rates.kernel_time("CUDA0") == 2e-6 and rates.sources == {CALIBRATED, STATED}
    assert rates.kernel_time("CUDA2") == FALLBACK_KERNEL_S and ASSUMED in rates.sources
    assert rates.kernel_time("CPU") == 0.0


def test_a_measured_streaming_bandwidth_is_what_decode_reads_at():
    rates = Rates(Inventory((_cuda("CUDA0", stream_bytes_s=int(4e11)), _cuda("CUDA1")), HOST))
    assert rates.bandwidth("CUDA0") == 4e11 and rates.bandwidth("CUDA1") == 1e12


def test_the_catalog_h200_carries_its_measured_figures_into_every_inventory_form(tmp_path):
    entry = catalog.device("h200-sxm")
    assert entry.bandwidth_bytes_s == int(4800e9) and entry.stream_bytes_s == int(1600e9)
    assert entry.kernel_seconds == pytest.approx(1.36e-6) and "nvidia-h200.json" in entry.measured_source
    cli = inventory_from_cli(["CUDA0=h200-sxm"], "64GiB", None).get("CUDA0")
    assert cli is not None and (cli.stream_bytes_s, cli.kernel_seconds) == (entry.stream_bytes_s, entry.kernel_seconds)
    # a bandwidth stated for the card itself wins over the product's measurement
    own = inventory_from_cli(["CUDA0=h200-sxm,bw=3000"], "64GiB", None).get("CUDA0")
    assert own is not None and own.stream_bytes_s == 0 and Rates(Inventory((own,), HOST)).bandwidth("CUDA0") == 3e12
    doc = {"host": {"ram": "64GiB"}, "devices": [{"name": "CUDA0", "catalog": "h200-sxm"},
                                                 {"name": "CUDA1", "catalog": "h200-sxm", "bandwidth_gbs": 4000}]}
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc))
    inv = load_inventory(path)
    assert Rates(inv).bandwidth("CUDA0") == 1.6e12 and Rates(inv).bandwidth("CUDA1") == 4e12


def test_a_measured_block_missing_a_figure_is_refused(tmp_path):
    path = tmp_path / "catalog.yaml"
    text = catalog.catalog_path().read_text()
    path.write_text(text.replace("      kernel_us: 1.36\n", "", 1))
    with pytest.raises(Exception, match="kernel_us"):
        catalog.load_catalog(str(path))


def test_the_estimate_counts_each_devices_op_nodes_of_the_token_graph(gemma):
    ctx, _ = gemma
    n = ctx.facts.n_layer_all
    inv = Inventory((_cuda(),), HOST)
    est = estimate(ctx, parse_llama_flags(["-ngl", "99", "-c", "1024"]), inv)
    assert view_of_estimate(ctx, est).kernels == est.decode_kernels   # what a plan's prediction reads
    whole = dict(est.decode_kernels)
    half = dict(estimate(ctx, parse_llama_flags(["-ngl", str(n // 2), "-c", "1024"]), inv).decode_kernels)
    none = dict(estimate(ctx, parse_llama_flags(["-ngl", "0", "-c", "1024"]), inv).decode_kernels)
    # every layer on the device: the host keeps the embedding's lookup (get_rows, llama.cpp's input layer) alone
    assert whole["CPU"] == 1 and whole["CUDA0"] > 20 * n
    # half the layers go back to the host with their nodes; no layer on the device: every node on the host
    assert half["CUDA0"] < whole["CUDA0"] and none == {"CPU": sum(whole.values())} == {"CPU": sum(half.values())}
    assert estimate(ctx, parse_llama_flags(["-ngl", "99", "-c", "1024"]), inv, exact_compute=False).decode_kernels == ()


def test_the_schedulers_op_nodes_leave_out_views_and_none(gemma):
    from runtime.engine.runner import ModelRunner
    ctx, _ = gemma
    runner = ModelRunner.load(ctx, parse_llama_flags(["-ngl", "99", "-c", "1024"]), Inventory((_cuda(),), HOST),
                              weights=False)
    report = runner.reserve_report
    assert report is not None
    tg = runner._graph(next(s for s in runner._graphs if s.n_tokens == 1))
    ops = [t for t in tg.graph.nodes if t.op is not Op.NONE and t.op not in VIEW_OPS]
    assert sum(report.tg_kernels.values()) == len(ops) < len(tg.graph.nodes) == report.n_nodes_tg


def test_the_catalog_h200_figures_are_the_records_least_squares_fit():
    from bench.bench_gpu_throughput import RECORD as BENCH_RECORD
    from bench.bench_gpu_throughput import record_rows
    assert BENCH_RECORD == RECORD
    rows = [r for r in record_rows(json.loads(RECORD.read_text()))[0] if r.full_offload]
    assert len(rows) == 9
    a = np.array([[r.gpu_bytes, r.tg_kernels] for r in rows], dtype=float)
    (inv_bw, tau), *_ = np.linalg.lstsq(a, np.array([1 / r.tg_measured for r in rows]), rcond=None)
    entry = catalog.device("h200-sxm")
    assert entry.stream_bytes_s == pytest.approx(1 / inv_bw, rel=0.01)
    assert entry.kernel_seconds == pytest.approx(tau, rel=0.01)
