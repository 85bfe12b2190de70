"""`fitplan serve` run as a user runs it, for peer tests: a subprocess on a plan file, one request
while it serves, SIGTERM, and the JSON memory checks it printed (one per stage)."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ServeRun:
    pid: int                     # llama-server's pid, as serve announced it
    checks: list[dict[str, Any]]   # serve's memory checks, in order ("load", then "shutdown")
    response: dict[str, Any]     # the answer to the request


def serve_once(plan: Path, llama_tools: Path, workdir: Path, body: dict[str, Any], *extra: str) -> ServeRun:
    """`fitplan serve PLAN --format json`, one POST /completion of `body`, then SIGTERM; fails with
    serve's stderr if it does not exit 0."""
    errors = workdir / "serve.err"
    with open(errors, "w") as err_file:
        proc = subprocess.Popen([sys.executable, "-m", "planner.cli", "serve", str(plan), "--port", "0",
                                 "--llama-bin", str(llama_tools), "--format", "json", *extra],
                                stdout=subprocess.PIPE, stderr=err_file, text=True)
    assert proc.stdout is not None
    try:
        first = proc.stdout.readline()
        found = re.search(r"llama-server \(pid (\d+)\) serves (http://127\.0\.0\.1:\d+);", first)
        assert found, first + errors.read_text()
        req = urllib.request.Request(f"{found.group(2)}/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as resp:
            response = json.load(resp)
        proc.send_signal(signal.SIGTERM)
        # read through the buffer readline() filled: communicate() reads the pipe's fd and would skip
        # whatever that buffer already holds (at times the whole load check)
        out = proc.stdout.read()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, errors.read_text()
    return ServeRun(int(found.group(1)), documents(first + out), response)


def documents(text: str) -> list[dict[str, Any]]:
    """The JSON documents printed one after another."""
    decoder, docs = json.JSONDecoder(), []
    pos = text.find("{")
    while 0 <= pos < len(text):
        doc, end = decoder.raw_decode(text, pos)
        docs.append(doc)
        pos = text.find("{", end)
    return docs
