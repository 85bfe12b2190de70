"""`fitplan sweep` through the CLI: CSV to a file or stdout, the PNG, exit-2 errors, nothing half-written.

Model and hand-derived figures as in tests/planner/sweeps/test_sweep.py: llama_spec(n_layer=2, n_embd=256,
n_head=8, n_head_kv=2, ...); KV per layer and cell 256 bytes in f16, 136 in q8_0.
"""
from __future__ import annotations

import csv
import io
import json
import sys

import pytest

from planner.cli import main
from planner.synth.gguf_factory import llama_spec

KV_F16_CELL = 256


def kv_q8_cuda(cells: int) -> int:
    """Two layers' q8_0 K and V (64 values per cell: 68 bytes), each + row_size(q8_0, 448) = 476 on a
    CUDA buffer (get_alloc_size pads quantized rows to MATRIX_ROW_PADDING = 512), aligned to 128."""
    return 2 * 2 * ((68 * cells + 476 + 127) // 128 * 128)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep_cli") / "m.gguf"
    [written] = llama_spec(n_layer=2, n_embd=256, n_head=8, n_head_kv=2, n_ff=512, n_vocab=1000).write(path)
    return str(written)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["sweep", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_csv_to_stdout(capsys, model):
    code, out, err = _run(capsys, model, "--device", "CUDA0=1GiB", "--vary", "ctx=1024..2048",
                          "--vary", "cache=f16,q8_0")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    gpu = [r for r in rows if r["device"] == "CUDA0"]
    assert [(r["ctx"], r["cache"]) for r in gpu] == [("1024", "f16"), ("1024", "q8_0"), ("2048", "f16"),
                                                    ("2048", "q8_0")]
    assert [int(r["context_bytes"]) for r in gpu] == [2 * 1024 * KV_F16_CELL, kv_q8_cuda(1024),
                                                     2 * 2048 * KV_F16_CELL, kv_q8_cuda(2048)]


def test_csv_and_png_files(capsys, model, tmp_path):
    out_csv, out_png = tmp_path / "s.csv", tmp_path / "s.png"
    code, out, err = _run(capsys, model, "--device", "CUDA0=1GiB", "--device", "CUDA1=1GiB",
                          "--vary", "ts=steps", "-o", str(out_csv), "--plot", str(out_png), "--", "-c", "1024")
    assert code == 0, err
    assert "2 points, 6 rows written" in out   # ts 1/2 and 2/1, each CUDA0, CUDA1, Host
    rows = list(csv.DictReader(out_csv.open()))
    assert [r["ts"] for r in rows if r["device"] == "CUDA0"] == ["1/2", "2/1"]
    assert out_png.read_bytes()[:8] == PNG_MAGIC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.csv", "s.png"]   # no partial files left


def test_base_flags_after_double_dash(capsys, model):
    code, out, err = _run(capsys, model, "--format", "json", "--device", "CUDA0=1GiB", "--vary", "np=1,2",
                          "--", "-c", "2048", "-ctk", "q8_0", "-ctv", "q8_0")
    assert code == 0, err
    doc = json.loads(out)
    assert [p["flags"] for p in doc["points"]] == ["-c 2048 -ctk q8_0 -ctv q8_0", "-c 2048 -np 2 -ctk q8_0 -ctv q8_0"]


def test_table_format(capsys, model):
    code, out, err = _run(capsys, model, "--format", "table", "--device", "CUDA0=1GiB", "--vary", "budget=1,1MiB",
                          "--", "-c", "1024")
    assert code == 0, err
    lines = out.strip().splitlines()
    header = next(line for line in lines if line.startswith("budget"))
    assert header.split() == ["budget", "CUDA0", "MiB", "Host", "MiB", "n_ctx", "fits"]
    assert lines[-1].split()[0] == "1MiB" and lines[-1].split()[-1] == "no"


@pytest.mark.parametrize("argv, message", [
    (["--vary", "ctx=abc"], "--vary ctx: expected a whole number"),
    (["--vary", "frobs=1"], "unknown axis"),
    (["--vary", "cache=f17"], "unsupported cache type"),
    (["--vary", "ctx=1024", "--", "--nonsense"], "unknown llama.cpp flag"),
    (["--vary", "ctx=max"], "--mode plan"),
    (["--vary", "ts=steps", "--device", "CUDA0=1GiB"], "two devices"),
    (["--vary", "ctx=1024", "-o", "/nonexistent-dir/x.csv"], "no such directory"),
    (["--vary", "ctx=1024", "--format", "xml"], "--format 'xml'"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, model, argv, message):
    code, _, err = _run(capsys, model, *argv)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bad_plot_path_writes_no_csv_either(capsys, model, tmp_path):
    code, _, err = _run(capsys, model, "--vary", "ctx=1024", "-o", str(tmp_path / "s.csv"),
                        "--plot", str(tmp_path / "absent" / "s.png"))
    assert code == 2 and "no such directory" in err
    assert list(tmp_path.iterdir()) == []


def test_missing_model_is_exit_2(capsys, tmp_path):
    code, _, err = _run(capsys, str(tmp_path / "absent.gguf"), "--vary", "ctx=1024")
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_plot_without_matplotlib_is_exit_2_before_any_work(capsys, model, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # `import matplotlib` now raises ImportError
    code, _, err = _run(capsys, model, "--vary", "ctx=1024", "-o", str(tmp_path / "s.csv"),
                          "--plot", str(tmp_path / "s.png"))
    assert code == 2 and "pip install 'fitplan[plots]'" in err
    assert list(tmp_path.iterdir()) == []


def test_plan_mode_marks_infeasible_points(capsys, model):
    # a 1 MiB device budget and 1 GiB of RAM (the host keeps 2 GiB for other work: budget 0) fit nothing
    code, out, err = _run(capsys, model, "--device", "CUDA0=1GiB", "--ram", "1GiB", "--mode", "plan",
                          "--vary", "budget=1MiB", "--vary", "ctx=1024")
    assert code == 0, err
    [row] = list(csv.DictReader(io.StringIO(out)))
    assert (row["feasible"], row["fits"], row["device"]) == ("0", "0", "")


def test_plan_mode_refuses_placement_flags(capsys, model):
    code, _, err = _run(capsys, model, "--device", "CUDA0=1GiB", "--ram", "16GiB", "--mode", "plan",
                        "--vary", "ctx=1024", "--", "-ngl", "1")
    assert code == 2 and "n_gpu_layers" in err


def test_plan_mode_needs_ram(capsys, model):
    code, _, err = _run(capsys, model, "--device", "CUDA0=1GiB", "--mode", "plan", "--vary", "ctx=1024")
    assert code == 2 and "--ram" in err


class _FakeBar:
    def __init__(self, length: int) -> None:
        self.length, self.done = length, 0

    def __enter__(self):  # the bar context, as click.progressbar returns it
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: int) -> None:
        self.done += n


@pytest.mark.parametrize("seconds_per_point, shown", [(1.0, True), (0.01, False)])
def test_progress_bar_only_on_long_sweeps(monkeypatch, seconds_per_point, shown):
    from planner.cli import sweep as commands_sweep

    clock = iter(i * seconds_per_point for i in range(100))
    monkeypatch.setattr(commands_sweep.time, "monotonic", lambda: next(clock))
    bars: list[_FakeBar] = []
    monkeypatch.setattr(commands_sweep.typer, "progressbar", lambda length, **_: bars.append(_FakeBar(length))
                        or bars[-1])
    progress = commands_sweep._Progress()   # reads the clock once: t = 0
    for done in range(1, 11):                # 10 points, one clock tick each
        progress(done, 10)
    progress.close()
    # after the first point the prediction is 10 x seconds_per_point: 10 s opens a bar, 0.1 s does not
    assert [(b.length, b.done) for b in bars] == ([(10, 10)] if shown else [])


def test_plan_mode_plot_has_speed_and_context_panels(model):
    from planner.api import as_inventory
    from planner.sweeps.plots import plot_sweep
    from planner.sweeps.sweep import parse_axis, sweep

    r = sweep(model, [parse_axis("budget", "1,2"), parse_axis("ctx", "max")], as_inventory(["CUDA0=2GiB"], ram="16GiB"),
              mode="plan")
    titles = [ax.get_title() for ax in plot_sweep(r).axes if ax.get_visible()]
    assert titles == ["CUDA0", "Host (RAM)", "plan: predicted decode", "plan: largest context that fits"]


def test_example_model_csv_and_png(capsys, tmp_path):
    """The issue's check: a sweep of the bundled example writes the CSV and a labelled PNG."""
    out_csv, out_png = tmp_path / "s.csv", tmp_path / "s.png"
    code, _, err = _run(capsys, "example:gemma3-270m", "--device", "CUDA0=1536MiB", "--vary", "ctx=4096..131072",
                          "--vary", "cache=f16,q8_0", "-o", str(out_csv), "--plot", str(out_png))
    assert code == 0, err
    rows = list(csv.DictReader(out_csv.open()))
    gpu = [r for r in rows if r["device"] == "CUDA0"]
    assert [(r["ctx"], r["cache"]) for r in gpu] == [(str(c), k) for c in (4096, 8192, 16384, 32768, 65536, 131072)
                                                    for k in ("f16", "q8_0")]
    assert {r["layers"] for r in gpu} == {"0-17,output"}   # 18 layers and the output, all on the GPU
    assert out_png.read_bytes()[:8] == PNG_MAGIC

    from planner.api import as_inventory
    from planner.sweeps.plots import plot_sweep
    from planner.sweeps.sweep import parse_axis, sweep

    r = sweep("example:gemma3-270m", [parse_axis("ctx", "4096..131072"), parse_axis("cache", "f16,q8_0")],
              as_inventory(["CUDA0=1536MiB"]))
    ax = plot_sweep(r).axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("context size -c (tokens)", "memory (GiB)")
