"""planner.sweeps.sweep: axis parsing, one-layer -ts steps, the points and the CSV.

The model: llama_spec(n_layer=2, n_embd=256, n_head=8, n_head_kv=2, n_ff=512, n_vocab=1000), as in
tests/cli/test_estimate_cli.py. By hand, on a CUDA device (tensors padded to 128 bytes):
  one layer: 2 norms 2048, q (Q4_K 256x256) 36864, k (Q4_K 256x64) 9216, v (Q8_0 256x64) 17408,
  o 36864, gate (Q4_K 256x512) 73728, up 73728, down (Q6_K 512x256) 107520 = 357376;
  the output layer: output_norm 1024 + output (Q6_K 256x1000 = 210000 -> 210048) = 211072.
  KV per layer and cell: K and V each 64 values (2 KV heads x head_dim 32): f16 2 x 64 x 2 = 256
  bytes; q8_0 2 x (2 blocks x 34) = 136 bytes.
llama.cpp splits 3 layers (2 + the output layer) between devices; -ts k/(3-k) gives the first
device exactly the first k of them (placement.py: cumulative shares k/3).
"""
from __future__ import annotations

import csv
import io
import logging

import pytest

from planner.api import as_flags, as_inventory
from planner.core.errors import FlagError
from planner.core.units import GiB, MiB
from planner.sweeps.sweep import CSV_COLUMNS, parse_axis, parse_vary, sweep
from planner.synth.gguf_factory import llama_spec

# On CUDA buffers (ggml-cuda.cu get_alloc_size) a quantized tensor whose rows are not a multiple of
# MATRIX_ROW_PADDING = 512 values gets row_size(type, 512 - ne0 % 512) more, before the 128-byte
# alignment. Per layer of this model (n_embd 256): attn_q, attn_output, ffn_gate, ffn_up (Q4_K, +144
# each), attn_k (Q4_K, +144), attn_v (Q8_0, +272); ffn_down (512-wide rows) and the norms add nothing.
# pad128(1024) x2 + pad128(36864+144) x2 + pad128(9216+144) + pad128(17408+272) + pad128(73728+144) x2 + 107520
LAYER = 2 * 1024 + 2 * 37120 + 9472 + 17792 + 2 * 73984 + 107520     # 359040
# output_norm (f32, 1024) + output (Q6_K 256 x 1000: 210000 + row_size(Q6_K, 256) = 210210, padded to 128)
OUTPUT = 1024 + 210304
KV_F16_CELL = 256


def kv_q8_cuda(cells: int) -> int:
    """Two layers' q8_0 K and V (64 values per cell: 68 bytes), each + row_size(q8_0, 448) = 476 on CUDA."""
    return 2 * 2 * ((68 * cells + 476 + 127) // 128 * 128)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "m.gguf"
    [written] = llama_spec(n_layer=2, n_embd=256, n_head=8, n_head_kv=2, n_ff=512, n_vocab=1000).write(path)
    return str(written)


TWO_GPUS = ["CUDA0=1GiB", "CUDA1=1GiB"]


# --------------------------------------------------------------------------- axes

@pytest.mark.parametrize("text, values", [
    ("ctx=4096..32768", (4096, 8192, 16384, 32768)),        # doubling
    ("ctx=4096..16384:4096", (4096, 8192, 12288, 16384)),   # stepped
    ("ctx=1000..5000", (1000, 2000, 4000)),                 # doubling stops at the last value <= the end
    ("np=1,2,4", (1, 2, 4)),
    ("ub=512,128,512", (512, 128)),                         # duplicates dropped, order kept
    ("cache=F16,q8_0", ("f16", "q8_0")),
    ("ts=3/1,1/1", ("3/1", "1/1")),
    ("budget=8,512MiB,-2", (8 * GiB, 512 * MiB, -2 * GiB)),  # bare numbers are GiB, as --max-vram
    ("budget=256MiB..1GiB:256MiB", (256 * MiB, 512 * MiB, 768 * MiB, 1024 * MiB)),
])
def test_parse_vary(text, values):
    assert parse_vary(text).values == values


@pytest.mark.parametrize("text, message", [
    ("ctx", "expected NAME=VALUES"),
    ("threads=4", "unknown axis"),
    ("ctx=4k", "expected a whole number"),
    ("ctx=8192..4096", "ends below its start"),
    ("ctx=0..4096", "must start above 0"),
    ("ctx=1..9:0", "step must be above 0"),
    ("cache=f17", "unsupported cache type"),
    ("np=0", "out of range"),
    ("ctx=4096,,8192", "an empty value"),
    ("budget=lots", "expected a size"),
])
def test_parse_vary_refuses(text, message):
    with pytest.raises(FlagError, match=message):
        parse_vary(text)


def test_axis_text_round_trips_budgets():
    axis = parse_axis("budget", "8GiB,1536MiB,-2")
    assert [axis.text(v) for v in axis.values] == ["8GiB", "1536MiB", "-2GiB"]


# --------------------------------------------------------------------------- one-layer steps

def test_ts_steps_move_one_layer_per_step(model):
    r = sweep(model, [parse_axis("ts", "steps")], as_inventory(TWO_GPUS), as_flags("-c 1024"))
    assert r.axes[0].values == ("1/2", "2/1")
    first, second = r.points
    assert first.device("CUDA0").layers == "0" and first.device("CUDA1").layers == "1,output"
    assert second.device("CUDA0").layers == "0-1" and second.device("CUDA1").layers == "output"
    assert first.device("CUDA0").model_bytes == LAYER
    assert second.device("CUDA0").model_bytes == 2 * LAYER
    assert first.device("CUDA1").model_bytes == LAYER + OUTPUT
    assert second.device("CUDA1").model_bytes == OUTPUT
    assert first.device("CUDA0").context_bytes == 1024 * KV_F16_CELL
    assert second.device("CUDA0").context_bytes == 2 * 1024 * KV_F16_CELL
    assert second.device("CUDA1").context_bytes == 0


def test_ts_steps_count_only_offloaded_layers(model):
    # -ngl 2 offloads the last two of the three layers (the output layer is counted first)
    r = sweep(model, [parse_axis("ts", "steps")], as_inventory(TWO_GPUS), as_flags("-c 1024 -ngl 2"))
    assert r.axes[0].values == ("1/1",)
    [p] = r.points
    assert (p.device("CUDA0").layers, p.device("CUDA1").layers) == ("1", "output")


def test_ts_steps_need_two_devices(model):
    with pytest.raises(FlagError, match="two devices"):
        sweep(model, [parse_axis("ts", "steps")], as_inventory(["CUDA0=1GiB"]))


# --------------------------------------------------------------------------- points

def test_every_combination_in_order_first_axis_slowest(model):
    axes = [parse_axis("ctx", "1024,2048"), parse_axis("cache", "f16,q8_0")]
    r = sweep(model, axes, as_inventory(["CUDA0=1GiB"]))
    assert [p.settings for p in r.points] == [(1024, "f16"), (1024, "q8_0"), (2048, "f16"), (2048, "q8_0")]
    assert [p.flags for p in r.points] == ["-c 1024", "-c 1024 -ctk q8_0 -ctv q8_0", "-c 2048",
                                           "-c 2048 -ctk q8_0 -ctv q8_0"]
    # both layers on CUDA0: context bytes = 2 layers x cells x bytes per cell
    assert [p.device("CUDA0").context_bytes for p in r.points] == [
        2 * 1024 * KV_F16_CELL, kv_q8_cuda(1024), 2 * 2048 * KV_F16_CELL, kv_q8_cuda(2048)]
    assert [p.n_ctx for p in r.points] == [1024, 1024, 2048, 2048]


def test_base_flags_apply_and_axes_override_them(model):
    r = sweep(model, [parse_axis("ctx", "2048")], as_inventory(["CUDA0=1GiB"]), as_flags("-c 512 -ctk q8_0"))
    [p] = r.points
    assert p.flags == "-c 2048 -ctk q8_0"
    # K in q8_0 (68 bytes a cell, + row_size(q8_0, 448) = 476 of CUDA row padding, aligned to 128),
    # V in f16 (128 bytes a cell, not padded), 2 layers
    assert p.device("CUDA0").context_bytes == 2 * ((2048 * 68 + 476 + 127) // 128 * 128 + 2048 * 128)


def test_budgets_follow_max_vram_rules(model):
    # CUDA0 has 1 GiB free: "8" caps at free (1 GiB), "512MiB" is itself, "-0.75" is free - 768 MiB,
    # no budget axis would be free - 512 MiB. The model's weights plus 1024 cells of KV exceed 1 MiB.
    r = sweep(model, [parse_axis("budget", "8,512MiB,-0.75,1MiB")], as_inventory(["CUDA0=1GiB"]),
              as_flags("-c 1024"))
    assert [p.device("CUDA0").budget_bytes for p in r.points] == [GiB, 512 * MiB, 256 * MiB, MiB]
    assert r.points[-1].fits is False and r.points[-1].device("CUDA0").fits is False
    # Host has no budget when the inventory does not know the host's RAM
    assert all(p.device("Host").budget_bytes is None for p in r.points)


def test_default_budget_and_host_budget_with_ram(model):
    r = sweep(model, [parse_axis("ctx", "1024")], as_inventory(["CUDA0=1GiB"], ram="32GiB"))
    [p] = r.points
    assert p.device("CUDA0").budget_bytes == GiB - 512 * MiB
    # the host keeps max(2 GiB, 10 % of 32 GiB = 3.2 GiB) for other work
    assert p.device("Host").budget_bytes == 32 * GiB - int(32 * GiB * 0.10)


def test_refusals(model):
    with pytest.raises(FlagError, match="nothing to vary"):
        sweep(model, [])
    with pytest.raises(FlagError, match="given twice"):
        sweep(model, [parse_axis("ctx", "1024"), parse_axis("ctx", "2048")])
    with pytest.raises(FlagError, match="given twice"):
        sweep(model, [parse_axis("cache", "f16"), parse_axis("ctk", "q8_0")])
    with pytest.raises(FlagError, match="--mode plan"):
        sweep(model, [parse_axis("ctx", "max")])
    with pytest.raises(FlagError, match="expected one of"):
        sweep(model, [parse_axis("ctx", "1024")], mode="guess")


def test_progress_is_called_after_every_point(model):
    calls = []
    sweep(model, [parse_axis("ctx", "1024..4096")], progress=lambda done, total: calls.append((done, total)))
    assert calls == [(1, 3), (2, 3), (3, 3)]


# --------------------------------------------------------------------------- CSV

def test_csv_has_one_row_per_point_and_device(model):
    axes = [parse_axis("ctx", "1024,2048"), parse_axis("budget", "1,1MiB")]
    r = sweep(model, axes, as_inventory(TWO_GPUS), as_flags("-ts 2/1"))
    rows = list(csv.DictReader(io.StringIO(r.to_csv())))
    assert list(rows[0]) == ["ctx", "budget", *CSV_COLUMNS]
    assert len(rows) == 4 * 3   # 4 points x (CUDA0, CUDA1, Host)
    first = rows[0]
    assert (first["ctx"], first["budget"], first["device"], first["layers"]) == ("1024", "1GiB", "CUDA0", "0-1")
    assert int(first["model_bytes"]) == 2 * LAYER
    assert int(first["context_bytes"]) == 2 * 1024 * KV_F16_CELL
    assert int(first["total_bytes"]) == sum(int(first[k]) for k in ("model_bytes", "context_bytes", "compute_bytes"))
    assert int(first["budget_bytes"]) == GiB
    host = rows[2]
    assert host["device"] == "Host" and host["budget_bytes"] == ""
    tight = [row for row in rows if row["budget"] == "1MiB" and row["device"] == "CUDA0"]
    assert {row["device_fits"] for row in tight} == {"0"} and {row["fits"] for row in tight} == {"0"}


def test_to_dict_lists_settings_and_devices(model):
    r = sweep(model, [parse_axis("np", "1,2")], as_inventory(["CUDA0=1GiB"]), as_flags("-c 2048"))
    d = r.to_dict()
    assert d["axes"] == {"np": ["1", "2"]} and d["mode"] == "estimate"
    assert [p["settings"] for p in d["points"]] == [{"np": "1"}, {"np": "2"}]
    assert [x["name"] for x in d["points"][0]["devices"]] == ["CUDA0", "Host"]


def test_a_plan_sweep_says_each_warning_once(tmp_path, caplog):
    """Every point of a plan sweep is a plan; a context past the training context (4096 here) is said once
    per context, not once per point: two budgets at -c 8192, then at -c 4096 (no warning)."""
    [path] = llama_spec(n_layer=2, n_embd=256, n_head=8, n_head_kv=2, n_ff=512, n_vocab=1000).write(tmp_path / "m.gguf")
    with caplog.at_level(logging.WARNING):
        r = sweep(str(path), [parse_axis("ctx", "8192,4096"), parse_axis("budget", "1GiB,2GiB")],
                  as_inventory(["CUDA0=8GiB"], ram="16GiB"), mode="plan")
    assert all(p.feasible for p in r.points)
    said = [rec.getMessage() for rec in caplog.records if "training context" in rec.getMessage()]
    assert len(said) == 1 and said[0].startswith("context 8192 is above the model's training context 4096")
