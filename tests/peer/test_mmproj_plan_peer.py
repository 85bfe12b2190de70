"""Issue #19's projector case: `fitplan plan --mmproj` on two loopback RPC devices, with the projector
on a device and in host memory (--no-mmproj-offload), each served by `fitplan serve` and confirmed by
the pinned llama-server: every model's load buffers (the target's, and clip's model size and compute
buffers) and the target's memory breakdown at exit match the plan within its budgets."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from planner.core.units import MiB
from planner.synth.mmproj_factory import write_gemma3_mmproj
from tests.support.serving import serve_once

pytestmark = pytest.mark.peer

BUDGET_MIB = 1100   # a device holds the 27-layer SigLIP projector (~930 MiB) or target layers, not both


@pytest.mark.parametrize("where", ["device", "host"])
def test_projector_plan_confirmed_by_llama_server(llama_tools: Path, rpc_endpoints: list[str], shapes_dir: Path,
                                                  tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str):
    mmproj = write_gemma3_mmproj(shapes_dir, n_text_embd=640)
    plan_file = tmp_path / "plan.yaml"
    argv = ["plan", "example:gemma3-270m", "--device", f"RPC0=4GiB@{rpc_endpoints[0]}",
            "--device", f"RPC1=4GiB@{rpc_endpoints[1]}", "--ram", "16GiB",
            "--max-vram", f"RPC0={BUDGET_MIB}MiB,RPC1={BUDGET_MIB}MiB", "-c", "4096", "--mmproj", str(mmproj),
            "--format", "json", "-o", str(plan_file)] + (["--mmproj-device", "none"] if where == "host" else [])
    capsys.readouterr()
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    projector = next(c for c in doc["companions"] if c["kind"] == "mmproj")
    on = {d["name"] for d in projector["devices"] if d["model_bytes"]}
    if where == "host":
        assert "--no-mmproj-offload" in doc["argv"] and on == {"Host"}
    else:
        assert "--no-mmproj-offload" not in doc["argv"] and on <= {"RPC0", "RPC1"} and len(on) == 1
    run = serve_once(plan_file, llama_tools, tmp_path, {"prompt": [10, 11, 12], "n_predict": 2})
    assert [c["stage"] for c in run.checks] == ["load", "shutdown"]
    for check in run.checks:
        assert check["fits"] and check["verdict"] == "fits; matches the estimate", check
    load = {d["name"]: d for d in run.checks[0]["devices"]}
    weights = max(d["model_bytes"] for d in projector["devices"])
    for name in on:   # the projector's weights are in the load check of the device (or host) holding it
        assert load[name]["model_bytes"] >= weights - MiB, (name, load[name], weights)
