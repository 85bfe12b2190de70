"""The overhead term (planner/llama/overhead.py) in every device row, and the GPU-host rules beside it: one GPU
build per process, pinned host memory, the generation graph's split count, Apple's working set, the Windows
note. Figures are derived here from the H200 record's numbers (596 MiB per llama.cpp-process device, 1051 MiB
for two idle rpc-servers) and from the definitions."""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner.api import as_inventory
from planner.core.errors import FlagError
from planner.core.units import GiB, MiB
from planner.hardware.apple import default_working_set, working_set
from planner.hardware.budgets import DEFAULT_DEVICE_MARGIN, resolve_budgets
from planner.llama.context import model_context
from planner.llama.overhead import ProcessKind, device_overhead
from planner.llama.placement import Device
from planner.memory.estimate import estimate
from planner.search.result import PlanRequest, plan_table
from planner.search.search import plan
from planner.synth.gguf_factory import llama_spec
from runtime.ggml.profiles import Backend


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    [path] = llama_spec(n_layer=8, n_embd=1024, n_head=8, n_head_kv=2, n_ff=2816, n_vocab=4096).write(
        tmp_path_factory.mktemp("overhead") / "llama.gguf")
    return model_context(str(path))


def _device(name: str, backend: Backend, remote: Backend | None = None) -> Device:
    return Device(name, backend, 256, GiB, False, remote_backend=remote)


def test_figures_by_backend_and_process():
    h200 = as_inventory(["CUDA0=h100-sxm"])
    h200 = replace(h200, devices=(replace(h200.devices[0], compute_capability=900),))
    measured = device_overhead(_device("CUDA0", Backend.CUDA), h200)
    assert measured is not None and measured.bytes == 596 * MiB and measured.measured
    assert measured.process is ProcessKind.LLAMA
    other = device_overhead(_device("CUDA0", Backend.CUDA), as_inventory(["CUDA0=rtx3060"]))
    assert other is not None and other.bytes == 596 * MiB and not other.measured and other.label == "assumed"
    rpc = device_overhead(_device("RPC0", Backend.RPC, Backend.CUDA))
    assert rpc is not None and rpc.process is ProcessKind.RPC_SERVER and rpc.bytes * 2 // MiB == 1050   # 1051 MiB
    assert device_overhead(_device("RPC0", Backend.RPC, Backend.CPU)) is None     # its buffers are host RAM
    metal = device_overhead(_device("MTL0", Backend.METAL))
    assert metal is not None and not metal.measured and "not measured on Metal" in metal.source


def test_every_row_carries_its_overhead_and_the_json_its_source(model):
    est = estimate(model, ["-c", "4096", "-ngl", "99"], as_inventory(["CUDA0=rtx3060"], ram="16GiB"))
    rows = {d["name"]: d for d in est.to_dict()["devices"]}
    assert rows["CUDA0"]["overhead_bytes"] == 596 * MiB and rows["Host"]["overhead_bytes"] == 0
    source = est.to_dict()["overheads"]["CUDA0"]
    assert source["measured"] is False and "nvidia-h200.json" in source["source"]
    assert "overhead MiB" in est.to_table() and "overhead 596 MiB on CUDA0" in est.to_table()


def test_a_plan_fits_rows_and_overhead_in_the_budget(model):
    # a 1 GiB budget holds the overhead's 596 MiB and the rows; the Windows line says what the 12 GiB card keeps free
    inv = as_inventory(["CUDA0=rtx3060"], ram="16GiB")
    result = plan(model, inv, PlanRequest(max_ctx=True), max_vram="CUDA0=1GiB")
    cuda = next(d for d in result.estimate.totals if d.name == "CUDA0")
    assert cuda.overhead_bytes == 596 * MiB
    assert cuda.total_bytes + cuda.overhead_bytes <= GiB
    table = plan_table(result)
    assert "on Windows, CUDA allocations past a card's memory spill" in table
    left = 12 * GiB - cuda.total_bytes - cuda.overhead_bytes   # the catalog's 12 GiB, less rows and overhead
    assert f"CUDA0 {-(-left // MiB)} MiB" in table                # MiB rounded up, as fmt_mib prints


def test_cuda_and_rocm_in_one_process_are_refused_with_the_fix(model):
    inv = as_inventory(["CUDA0=rtx3060", "ROCm0=rx7900xtx"], ram="16GiB")
    with pytest.raises(FlagError, match="use two endpoints"):
        estimate(model, ["-c", "1024"], inv)
    estimate(model, ["-c", "1024", "-dev", "CUDA0"], inv)   # one build's devices alone: fine


def test_pinned_host_weights_and_the_split_count(model):
    inv = as_inventory(["CUDA0=rtx3060"], ram="16GiB")
    partial = estimate(model, ["-c", "1024", "-ngl", "4"], inv)
    [pinned] = [n for n in partial.notes if "CUDA_Host" in n]
    assert "pinned (page-locked)" in pinned and "GGML_CUDA_NO_PINNED" in pinned
    assert partial.decode_splits >= 2 and "generation graph:" in partial.to_table()
    full = estimate(model, ["-c", "1024", "-ngl", "99"], inv)
    assert not any("CUDA_Host" in n for n in full.notes)
    # the KV cache on the host splits every layer's attention off the device: seed 000's misplacement reading
    nkvo = estimate(model, ["-c", "1024", "-ngl", "99", "-nkvo"], inv)
    assert nkvo.decode_splits > full.decode_splits and "misplaced" in nkvo.to_table()


def test_apple_working_set_caps_the_metal_budget():
    assert default_working_set(16 * GiB) == 16 * GiB * 2 // 3
    assert default_working_set(64 * GiB) == 48 * GiB
    inv = as_inventory(["MTL0=m1-max"], ram="64GiB")
    ws = working_set(inv.devices[0])
    assert ws is not None and ws.bytes == 48 * GiB and "assumed" in ws.source
    assert working_set(inv.devices[0], 57344).bytes == 56 * GiB   # iogpu.wired_limit_mb=57344
    budgets = resolve_budgets(inv)
    assert budgets.devices["MTL0"] == min(48 * GiB - DEFAULT_DEVICE_MARGIN, budgets.host_bytes)
