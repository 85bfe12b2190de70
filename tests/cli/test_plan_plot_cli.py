"""`fitplan plan --plot FILE.png`: the picture is written whole, bad paths and a missing matplotlib
are one line and exit 2."""
from __future__ import annotations

import sys

import pytest

from planner.cli import main
from planner.synth.gguf_factory import llama_spec
from tests.support.overhead import cuda

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan_plot") / "m.gguf"
    [written] = llama_spec(n_layer=2).write(path)
    return str(written)


PLAN = ["--device", f"CUDA0={cuda(1024)}", "--ram", "16GiB", "-c", "1024"]


def test_plot_written(capsys, model, tmp_path):
    out = tmp_path / "plan.png"
    code = main(["plan", model, *PLAN, "--plot", str(out)])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert [p.name for p in tmp_path.iterdir()] == ["plan.png"]


def test_plot_into_missing_directory_is_exit_2(capsys, model, tmp_path):
    code = main(["plan", model, *PLAN, "--plot", str(tmp_path / "absent" / "plan.png")])
    _, err = capsys.readouterr()
    assert code == 2 and "no such directory" in err and len(err.strip().splitlines()) == 1


def test_plot_without_matplotlib_is_exit_2(capsys, model, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code = main(["plan", model, *PLAN, "--plot", str(tmp_path / "plan.png")])
    _, err = capsys.readouterr()
    assert code == 2 and "fitplan[plots]" in err
    assert list(tmp_path.iterdir()) == []
