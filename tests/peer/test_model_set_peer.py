"""A set of three models from `fitplan plan-set`, served by the pinned llama-server in router mode
(`--models-preset`, tools/server/server-models.cpp) on three loopback rpc-servers: the bundled Gemma 3
270M (chat, resident), a tiny BERT encoder (embedding, resident) and a small gemma3 chat model with
Gemma's vocabulary (on demand). Each answers a request; the buffers each instance logs (the router
forwards its children's lines prefixed by their port; -lv 4, which the children inherit) equal that
model's plan rows within 3 % or 4 MiB; the on-demand load leaves the resident models loaded, and all
three together stay within every budget."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from planner.cli import main
from planner.emit.set_exports import models_max, preset_ini
from planner.llama.placement import HOST
from planner.running.serve_set import KINDS, instance_logs, planned_rows
from planner.running.tool_runs import parse_buffers, rows_by_device
from planner.system.llama_tools import LOOPBACK, free_port, stop_process
from tests.support.model_sets import set_files

pytestmark = pytest.mark.peer

MIB = 2**20


def _within(got: int, want: int) -> bool:
    return abs(got - want) <= max(0.03 * want, 4 * MIB)


class Router:
    def __init__(self, bin_dir: Path, preset: Path, n_max: int, log: Path) -> None:
        self.port, self.log = free_port(), log
        with open(log, "w") as out:
            self.proc = subprocess.Popen([str(bin_dir / "llama-server"), "--models-preset", str(preset),
                                          "--models-max", str(n_max), "-lv", "4", "--host", LOOPBACK,
                                          "--port", str(self.port)],
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def status(self) -> dict[str, str]:
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{self.port}/models", timeout=5) as resp:
                return {m["id"]: m["status"]["value"] for m in json.load(resp)["data"]}
        except OSError:
            return {}

    def wait_loaded(self, names: list[str], timeout_s: float = 90) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            status = self.status()
            if all(status.get(n) == "loaded" for n in names):
                return status
            time.sleep(0.3)
        raise AssertionError(self.log.read_text(errors="replace")[-3000:])

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(f"http://{LOOPBACK}:{self.port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.load(resp)

    def instance_logs(self) -> dict[str, str]:
        """Each model instance's own lines, by model name (the router prefixes them `[PORT] `)."""
        return instance_logs(self.log.read_text(errors="replace"))


def _json_lists(text: str) -> list[list]:
    """The JSON lists printed one after another (serve's checks at load and as the router stopped)."""
    decoder, out = json.JSONDecoder(), []
    pos = text.find("[")
    while 0 <= pos < len(text):
        value, end = decoder.raw_decode(text, pos)
        out.append(value)
        pos = text.find("\n[", end) + 1 or -1
    return out


def _set_plan(rpc_three: list[str], tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The three-model set planned for the rpc-servers: the set plan's path, the endpoint of each RPC device."""
    made = set_files(tmp_path)
    spec = tmp_path / "set.yaml"
    spec.write_text(yaml.safe_dump({"disk_read": "1GiB", "models": {
        **made.resident(), "small": {"model": made.small, "ctx": 1024, "resident": "on-demand"}}}))
    endpoint_of = {f"RPC{i}": ep for i, ep in enumerate(rpc_three)}
    devices = [a for name, ep in endpoint_of.items() for a in ("--device", f"{name}=1GiB@{ep}")]
    plan_path = tmp_path / "set-plan.json"
    # budgets the three together come close to: the chat model's layers take most of one rpc-server, and
    # the host holds every model's share (its token embeddings, the encoder, the small model's)
    assert main(["plan-set", str(spec), *devices, "--ram", "4GiB", "--max-vram", "300MiB", "--max-ram", "300MiB",
                 "-o", str(plan_path)]) == 0
    return plan_path, endpoint_of


def test_router_serves_the_set(llama_tools: Path, rpc_three: list[str], tmp_path: Path, capsys):
    plan_path, endpoint_of = _set_plan(rpc_three, tmp_path)
    capsys.readouterr()
    doc = json.loads(plan_path.read_text())
    models = {m["name"]: m for m in doc["models"]}
    preset = tmp_path / "set.ini"
    preset.write_text(preset_ini(doc))

    router = Router(llama_tools, preset, models_max(doc), tmp_path / "router.log")
    try:
        status = router.wait_loaded(["chat", "embed"])
        assert status["small"] == "unloaded"   # on demand: not loaded at startup
        chat = router.post("/v1/completions", {"model": "chat", "prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
        assert chat["usage"]["completion_tokens"] == 4
        vectors = router.post("/v1/embeddings", {"model": "embed", "input": [1, 2, 3]})
        assert len(vectors["data"][0]["embedding"]) == 128   # tiny_bert's width
        answer = router.post("/v1/completions",
                             {"model": "small", "prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
        assert answer["usage"]["completion_tokens"] == 4
        status = router.wait_loaded(["chat", "embed", "small"])   # the on-demand load unloaded no one
        logs = router.instance_logs()
    finally:
        stop_process(router.proc)

    measured = {name: rows_by_device(parse_buffers(text), endpoint_of) for name, text in logs.items()}
    assert set(measured) == {"chat", "embed", "small"}
    for name, rows in measured.items():
        want = planned_rows(models[name])
        got = {row: {k: kinds.get(k, 0) for k in KINDS} for row, kinds in rows.items() if any(kinds.values())}
        assert set(got) == set(want), (name, got, want)
        for row, kinds in want.items():
            for kind, n in kinds.items():
                assert _within(got[row][kind], n), (name, row, kind, got[row][kind], n)
    # all three loaded at once: every row within its budget, as llama.cpp allocated it
    budgets = {**doc["budgets"]["devices"], HOST: doc["budgets"]["host_bytes"]}
    for row, budget in budgets.items():
        used = sum(sum(rows.get(row, {}).values()) for rows in measured.values())
        assert used <= budget, (row, used, budget)


def test_fitplan_serve_of_a_set(llama_tools: Path, rpc_three: list[str], tmp_path: Path, capsys):
    """`fitplan serve SET-PLAN` as a user runs it: the router up with the resident models checked, the
    on-demand model loaded by a request, SIGTERM, and every instance's check matching its plan."""
    plan_path, _ = _set_plan(rpc_three, tmp_path)
    capsys.readouterr()
    proc = subprocess.Popen([sys.executable, "-m", "planner.cli", "serve", str(plan_path), "--port", "0",
                             "--llama-bin", str(llama_tools), "--format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        first = proc.stdout.readline()
        found = re.search(r"router \(pid \d+\) serves (http://127\.0\.0\.1:\d+);", first)
        assert found, first + (proc.stderr.read() if proc.stderr else "")
        body = json.dumps({"model": "small", "prompt": "Hello", "max_tokens": 2, "ignore_eos": True}).encode()
        req = urllib.request.Request(f"{found.group(1)}/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            assert json.load(resp)["usage"]["completion_tokens"] == 2
        proc.send_signal(signal.SIGTERM)
        out = proc.stdout.read()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    at_load, at_stop = _json_lists(out)
    assert sorted(c["model"] for c in at_load) == ["chat", "embed"]
    assert sorted(c["model"] for c in at_stop) == ["chat", "embed", "small"]
    assert all(c["matches"] for c in at_load + at_stop), at_stop
