"""The llama.cpp side of `fitplan validate --engine llama.cpp`: run the real tools on loopback
and read what they report.

- `llama_server(...)`: a llama-server bound to 127.0.0.1 on a free port for token-id prompts
  (/completion with n_probs, temperature 0); stopped by its own process, never by name.
- `parse_log(text)`: the figures llama.cpp logs at load (`load_tensors: X model buffer size`,
  `llama_kv_cache: X KV buffer size`, `sched_reserve: X compute buffer size`, and
  `graph: nodes = N, splits = S` or `graph (pp bs=.., tg bs=..): nodes = a / b, splits = c / d`).
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from planner.llama_tools import LOOPBACK, ToolsError, free_port
from planner.units import MiB

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 300.0

_BUFFER = re.compile(r"(load_tensors|llama_kv_cache|sched_reserve):\s+(\S+) (model|KV|compute) buffer size =\s+([\d.]+) MiB")
_GRAPH = re.compile(r"graph(?: \(pp bs=\d+, tg bs=\d+\))?: nodes = (\d+)(?: / (\d+))?, splits = (\d+)(?: / (\d+))?")
_KIND = {"model": "model", "KV": "context", "compute": "compute"}


@dataclass(frozen=True)
class LlamaLog:
    """What one llama.cpp load logged: buffers per (buffer type, kind) in bytes (from MiB with
    two decimals, so within 5 KiB), nodes and splits of the prompt and the one-token graph."""

    buffers: dict[tuple[str, str], int] = field(default_factory=dict)
    n_nodes_pp: int = 0
    n_nodes_tg: int = 0
    n_splits_pp: int = 0
    n_splits_tg: int = 0


def parse_log(text: str) -> LlamaLog:
    """The last load in the text wins (llama-cli and llama-fit-params log a dry run first)."""
    graphs = _GRAPH.findall(text)
    if not graphs:
        raise ToolsError("llama.cpp logged no 'graph: nodes = ..., splits = ...' line (was -v given?)")
    nodes_pp, nodes_tg, splits_pp, splits_tg = graphs[-1]
    buffers: dict[tuple[str, str], int] = {}
    for _stage, buft, kind, mib in _BUFFER.findall(text):
        buffers[(buft, _KIND[kind])] = round(float(mib) * MiB)
    return LlamaLog(buffers, int(nodes_pp), int(nodes_tg or nodes_pp), int(splits_pp), int(splits_tg or splits_pp))


@dataclass(frozen=True)
class TokenProbs:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class ServerClient:
    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(f"http://{LOOPBACK}:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
            return json.loads(resp.read())

    def greedy(self, prompt: list[int], n_predict: int, n_probs: int = 2) -> list[TokenProbs]:
        """llama.cpp's greedy continuation of token ids, with the top-n logprobs at each step."""
        doc = self.post("/completion", {"prompt": prompt, "n_predict": n_predict, "n_probs": n_probs,
                                        "temperature": 0, "cache_prompt": False, "ignore_eos": True})
        return [TokenProbs(int(p["id"]), float(p["logprob"]),
                           tuple((int(t["id"]), float(t["logprob"])) for t in p["top_logprobs"]))
                for p in doc["completion_probabilities"]]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def llama_server(bin_dir: Path, model: str, flags: list[str]) -> Iterator[ServerClient]:
    """A llama-server on 127.0.0.1 with `flags` (one slot, verbose log); stopped on exit."""
    with tempfile.TemporaryDirectory(prefix="fitplan-server-") as tmp:
        port = free_port()
        log_path = Path(tmp) / "server.log"
        argv = [str(bin_dir / "llama-server"), "-m", model, "--host", LOOPBACK, "--port", str(port),
                "-np", "1", "-v", *flags]
        with open(log_path, "w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _ready(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = log_path.read_text(errors="replace")[-1500:]
                    raise ToolsError(f"llama-server did not start ({' '.join(argv[1:])}): {tail}")
                time.sleep(0.2)
            yield ServerClient(port, log_path)
        finally:
            _stop(proc)
