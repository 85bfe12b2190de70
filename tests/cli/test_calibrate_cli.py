"""`fitplan calibrate` on this machine: it runs the pinned llama-bench on a tiny model (few repeats),
writes an inventory that `plan` loads, and the plan's prediction says it used calibrated rates.
Nothing here asserts a timing."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.cli import main
from planner.core.llama_tools import tools_dir
from tests.support.tiny_models import write_tiny

needs_tools = pytest.mark.skipif(tools_dir() is None, reason="the pinned llama.cpp tools are not built")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("calibrate")
    model = write_tiny(d / "tiny.gguf", "llama")
    out = d / "inventory.yaml"
    code = main(["calibrate", "--model", str(model), "--repeats", "1", "--prompt-tokens", "32",
                 "--gen-tokens", "4", "-o", str(out)])
    assert code == 0
    return model, out


@needs_tools
def test_calibrate_writes_an_inventory_with_the_method_next_to_each_figure(calibrated):
    _, out = calibrated
    doc = yaml.safe_load(out.read_text())
    block = doc["calibrated"]
    assert {"date", "method", "tool"} <= set(block)
    assert "llama-bench" in block["tool"] and "0c1e570" in block["tool"]
    for key in ("bandwidth_gbs", "fp16_tflops"):
        figure = block["host"][key]
        assert figure["value"] > 0 and figure["how"]


@needs_tools
def test_plan_uses_the_calibrated_inventory_and_says_so(capsys, calibrated):
    model, out = calibrated
    code, text, _ = run(capsys, "plan", str(model), "--devices", str(out), "--ctx", "256")
    assert code == 0
    [predicted] = [line for line in text.splitlines() if line.startswith("predicted:")]
    assert "calibrated" in predicted


@needs_tools
def test_a_wrong_key_in_the_calibrated_block_is_exit_2_with_one_line(capsys, calibrated, tmp_path):
    model, out = calibrated
    doc = yaml.safe_load(out.read_text())
    doc["calibrated"]["host"]["bandwith_gbs"] = doc["calibrated"]["host"].pop("bandwidth_gbs")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc, allow_unicode=True))
    code, _, err = run(capsys, "plan", str(model), "--devices", str(bad), "--ctx", "256")
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "calibrated.host.bandwith_gbs: unknown key (did you mean 'bandwidth_gbs'?)" in err
