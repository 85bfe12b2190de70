"""`fitplan serve` with the real llama-server: the Gemma 3 270M plan for two loopback rpc-servers
starts, answers a /completion of token ids, reports per-device memory within the estimate's
tolerance at load and at exit, and leaves no process behind after SIGTERM."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from planner.cli import main
from tests.support.serving import serve_once

pytestmark = pytest.mark.peer


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_serve_gemma_on_two_rpc_devices(llama_tools: Path, rpc_pair: list[str], tmp_path: Path, capsys):
    plan = tmp_path / "plan.yaml"
    # 200 MiB each: the layers on RPC0, the output layer on RPC1 (the whole model, 290 MiB as
    # llama-server loads it, fits neither alone)
    assert main(["plan", "example:gemma3-270m", "--device", f"RPC0=1GiB@{rpc_pair[0]}",
                 "--device", f"RPC1=1GiB@{rpc_pair[1]}", "--ram", "8GiB", "-c", "2048", "--max-vram", "200MiB",
                 "-o", str(plan)]) == 0
    capsys.readouterr()
    run = serve_once(plan, llama_tools, tmp_path, {"prompt": [10, 11, 12], "n_predict": 4})
    assert run.response["tokens_predicted"] == 4 and run.response["tokens_evaluated"] == 3
    assert [c["stage"] for c in run.checks] == ["load", "shutdown"]
    for check in run.checks:
        assert check["verdict"] == "fits; matches the estimate", check
        rows = {d["name"]: d for d in check["devices"]}
        assert list(rows) == ["RPC0", "RPC1", "Host"]
        assert rows["RPC0"]["model_bytes"] > 0 and rows["RPC0"]["context_bytes"] > 0   # layers and KV there
        assert rows["RPC1"]["model_bytes"] > 0        # the output layer
    assert _gone(run.pid)
