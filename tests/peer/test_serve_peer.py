"""`fitplan serve` with the real llama-server: the Gemma 3 270M plan for two loopback rpc-servers
starts, answers a /completion of token ids, reports per-device memory within the estimate's
tolerance at load and at exit, and leaves no process behind after SIGTERM."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from planner.cli import main

pytestmark = pytest.mark.peer


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_serve_gemma_on_two_rpc_devices(llama_tools: Path, rpc_pair: list[str], tmp_path: Path, capsys):
    plan = tmp_path / "plan.yaml"
    assert main(["plan", "example:gemma3-270m", "--device", f"RPC0=1GiB@{rpc_pair[0]}",
                 "--device", f"RPC1=1GiB@{rpc_pair[1]}", "--ram", "8GiB", "-c", "2048", "-o", str(plan)]) == 0
    capsys.readouterr()
    errors = tmp_path / "serve.err"
    with open(errors, "w") as err_file:
        proc = subprocess.Popen([sys.executable, "-m", "planner.cli", "serve", str(plan), "--port", "0",
                                 "--llama-bin", str(llama_tools), "--format", "json"],
                                stdout=subprocess.PIPE, stderr=err_file, text=True)
    try:
        first = proc.stdout.readline()
        found = re.search(r"llama-server \(pid (\d+)\) serves (http://127\.0\.0\.1:\d+);", first)
        assert found, first + errors.read_text()
        pid, url = int(found.group(1)), found.group(2)
        req = urllib.request.Request(f"{url}/completion", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"prompt": [10, 11, 12], "n_predict": 4}).encode())
        with urllib.request.urlopen(req, timeout=120) as resp:
            doc = json.loads(resp.read())
        assert doc["tokens_predicted"] == 4 and doc["tokens_evaluated"] == 3
        proc.send_signal(signal.SIGTERM)
        # read through the buffer readline() filled: communicate() reads the pipe's fd and would skip
        # whatever that buffer already holds (here, at times, the whole load check)
        out = proc.stdout.read()
        proc.wait(timeout=120)
        err = errors.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    decoder, text, checks = json.JSONDecoder(), first + out, []
    pos = text.index("{")
    while pos < len(text):
        doc, end = decoder.raw_decode(text, pos)
        checks.append(doc)
        pos = next((i for i in range(end, len(text)) if text[i] == "{"), len(text))
    assert [c["stage"] for c in checks] == ["load", "shutdown"]
    for check in checks:
        assert check["verdict"] == "fits; matches the estimate", check
        rows = {d["name"]: d for d in check["devices"]}
        assert list(rows) == ["RPC0", "RPC1", "Host"]
        assert rows["RPC0"]["model_bytes"] > 0 and rows["RPC0"]["context_bytes"] > 0   # layers and KV there
        assert rows["RPC1"]["model_bytes"] > 0        # the output layer
    assert _gone(pid)
