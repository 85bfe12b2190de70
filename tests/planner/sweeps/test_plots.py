"""planner.sweeps.plots: what each picture shows — labelled axes with units, one panel per device, bars
stacked from the byte figures given, budgets and layer labels."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from planner.api import as_flags, as_inventory
from planner.core.units import GiB, MiB
from planner.sweeps.plots import plot_memory, plot_sweep, save_figure
from planner.sweeps.sweep import parse_axis, sweep
from planner.synth.gguf_factory import llama_spec


@dataclass(frozen=True)
class Row:
    name: str
    model_bytes: int
    context_bytes: int
    compute_bytes: int


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("plots") / "m.gguf"
    [written] = llama_spec(n_layer=2).write(path)
    return str(written)


def test_sweep_panels_axes_and_series(model):
    r = sweep(model, [parse_axis("ctx", "1024..4096"), parse_axis("cache", "f16,q8_0")],
              as_inventory(["CUDA0=1GiB", "CUDA1=1GiB"]))
    fig = plot_sweep(r)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["CUDA0", "CUDA1", "Host (RAM)"]
    for ax in panels:
        assert ax.get_xlabel() == "context size -c (tokens)" and ax.get_ylabel() == "memory (GiB)"
        assert ax.get_xscale() == "log"   # a doubling range is drawn evenly spaced
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1k", "2k", "4k"]
    # one line per cache type, its points at x = ctx and y = that device's total in GiB
    lines = [ln for ln in panels[0].get_lines() if ln.get_label().startswith("cache=")]
    assert [ln.get_label() for ln in lines] == ["cache=f16", "cache=q8_0"]
    f16 = [p for p in r.points if p.settings[1] == "f16"]
    assert list(lines[0].get_xdata()) == [1024.0, 2048.0, 4096.0]
    assert list(lines[0].get_ydata()) == [p.device("CUDA0").total_bytes / GiB for p in f16]


def test_sweep_over_ts_is_categorical(model):
    r = sweep(model, [parse_axis("ts", "steps")], as_inventory(["CUDA0=1GiB", "CUDA1=1GiB"]), as_flags("-c 1024"))
    ax = plot_sweep(r).axes[0]
    assert ax.get_xlabel() == "tensor split -ts (layers per device)"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1/2", "2/1"]


def test_budget_line_and_hollow_markers(model):
    # 1 MiB is below anything this model needs: every CUDA0 point is over budget -> hollow markers
    r = sweep(model, [parse_axis("ctx", "1024,2048"), parse_axis("budget", "1MiB")], as_inventory(["CUDA0=1GiB"]))
    ax = plot_sweep(r).axes[0]
    budget = [ln for ln in ax.get_lines() if ln.get_label() == "budget"]
    assert len(budget) == 1 and list(budget[0].get_ydata()) == [MiB / GiB] * 2
    filled, hollow = ax.collections[:2]
    assert len(filled.get_offsets()) == 0 and len(hollow.get_offsets()) == 2


def test_memory_bars_stack_and_label():
    rows = [Row("CUDA0", 3 * GiB, 1 * GiB, GiB // 2), Row("CUDA1", 2 * GiB, 0, GiB // 4), Row("Host", GiB, 0, 0)]
    fig = plot_memory(rows, {"CUDA0": 6 * GiB, "CUDA1": 2 * GiB, "Host": 32 * GiB},
                      {"CUDA0": "0-19", "CUDA1": "20-31,output"}, title="t")
    dev, host = fig.axes
    assert [t.get_text() for t in dev.get_xticklabels()] == ["CUDA0", "CUDA1"]
    assert [t.get_text() for t in host.get_xticklabels()] == ["Host"]
    assert dev.get_ylabel() == host.get_ylabel() == "memory (GiB)"
    # bars in order model, context, compute; each starts where the one below ends
    bars = [(round(p.get_y(), 6), round(p.get_height(), 6)) for p in dev.patches]
    assert bars == [(0, 3), (0, 2), (3, 1), (2, 0), (4, 0.5), (2, 0.25)]
    assert [t.get_text() for t in dev.texts] == ["layers 0-19", "layers 20-31,output"]
    assert [list(seg[:, 1]) for seg in dev.collections[0].get_segments()] == [[6.0, 6.0]]
    assert fig._suptitle.get_text() == "t"


def test_save_figure_is_atomic_and_by_suffix(tmp_path, model):
    r = sweep(model, [parse_axis("np", "1,2")])
    save_figure(plot_sweep(r), tmp_path / "a.svg")
    assert (tmp_path / "a.svg").read_text().lstrip().startswith("<?xml")
    assert [p.name for p in tmp_path.iterdir()] == ["a.svg"]
