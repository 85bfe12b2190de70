"""`fitplan serve SET-PLAN.yaml`: a set plan (`fitplan plan-set -o`) served by llama-server in router
mode, and each model instance's load checked against its plan.

The router reads the set's preset (planning/set_exports.py) with `--models-preset`, caps its instances
with `--models-max` and starts one llama-server per model, resident models at startup, the others at
their first request (tools/server/server-models.cpp). It forwards each instance's log lines prefixed
`[PORT] ` and logs `spawning server instance with name=NAME on port PORT` first; the instances inherit
its `-lv 4`, at which they log their buffers. A model's check compares those buffers with its plan's
rows: model and context within 1 MiB, compute within 3 % or 4 MiB (as `fitplan serve` judges a plan).
"""
from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.core.errors import BadInput
from planner.core.units import fmt_mib
from planner.emit.set_exports import models_max, preset_ini
from planner.llama.commands import LLAMA_SERVER
from planner.llama.flags import arg
from planner.running.serve import COMPUTE_ABS, COMPUTE_REL, LOG_LEVEL, MODEL_SLACK, forward_signals
from planner.running.tool_runs import host_row, parse_buffers, rows_by_device
from planner.system.files import write_atomic
from planner.system.llama_tools import LOOPBACK, free_port, stop_process

KINDS = ("model", "context", "compute")
START_TIMEOUT_S = 300.0
_SPAWN = re.compile(r"spawning server instance with name=(\S+) on port (\d+)")


def router_argv(program: str, preset: Path, doc: dict[str, Any], host: str, port: int) -> list[str]:
    return [program, *arg("models_preset", preset), *arg("models_max", models_max(doc)), *LOG_LEVEL,
            *arg("host", host), *arg("port", port)]


def instance_logs(text: str) -> dict[str, str]:
    """Each model instance's own lines in a router's log, by model name."""
    out = {}
    lines = text.splitlines()
    for name, port in _SPAWN.findall(text):
        prefix = f"[{int(port):5d}] "
        out[name] = "\n".join(line[len(prefix):] for line in lines if line.startswith(prefix))
    return out


def planned_rows(model: dict[str, Any]) -> dict[str, dict[str, int]]:
    """A model's plan rows by budget row (the host's buffer types under Host) and kind."""
    rows: dict[str, dict[str, int]] = {}
    for d in model["devices"]:
        row = rows.setdefault(host_row(d["name"]), dict.fromkeys(KINDS, 0))
        for kind in KINDS:
            row[kind] += d[f"{kind}_bytes"]
    return {k: v for k, v in rows.items() if any(v.values())}


def _close(kind: str, got: int, want: int) -> bool:
    if kind == "compute":
        return abs(got - want) <= max(COMPUTE_REL * want, COMPUTE_ABS)
    return abs(got - want) <= MODEL_SLACK


@dataclass(frozen=True)
class InstanceCheck:
    model: str
    rows: dict[str, dict[str, int]]        # what the instance logged, by row and kind
    planned: dict[str, dict[str, int]]
    matches: bool

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "matches": self.matches, "logged": self.rows, "planned": self.planned}


def check_instance(doc: dict[str, Any], name: str, log_text: str) -> InstanceCheck:
    endpoint_of = {d["name"]: d["endpoint"] for d in doc["inventory"]["devices"] if d.get("endpoint")}
    model = next(m for m in doc["models"] if m["name"] == name)
    logged = {row: {k: kinds.get(k, 0) for k in KINDS}
              for row, kinds in rows_by_device(parse_buffers(log_text), endpoint_of).items() if any(kinds.values())}
    want = planned_rows(model)
    ok = set(logged) == set(want) and all(_close(k, logged[r][k], n) for r, kinds in want.items()
                                          for k, n in kinds.items())
    return InstanceCheck(name, logged, want, ok)


def check_table(checks: list[InstanceCheck]) -> str:
    lines = []
    for c in checks:
        lines.append(f"{c.model}: {'matches the plan' if c.matches else 'differs from the plan'}")
        for row in sorted(set(c.rows) | set(c.planned)):
            got, want = c.rows.get(row, {}), c.planned.get(row, {})
            lines.append(f"  {row}: " + ", ".join(f"{k} {fmt_mib(got.get(k, 0))}/{fmt_mib(want.get(k, 0))} MiB"
                                                   for k in KINDS) + " (logged/planned)")
    return "\n".join(lines)


def _status(port: int) -> dict[str, str]:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/models", timeout=5) as resp:
            return {m["id"]: m["status"]["value"] for m in json.load(resp)["data"]}
    except (OSError, ValueError, KeyError):
        return {}


def _wait_resident(proc: subprocess.Popen, port: int, names: list[str], log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BadInput(f"the llama-server router exited with {proc.returncode} (log {log_path})")
        status = _status(port)
        if status and all(status.get(n) == "loaded" for n in names):
            return
        time.sleep(0.3)
    raise BadInput(f"the resident models did not load within {START_TIMEOUT_S:.0f} s (log {log_path})")


def prepare_router(doc: dict[str, Any], bin_dir: Path | None, host: str, port: int, workdir: Path) -> list[str]:
    """The preset written into `workdir`; the router's argument vector."""
    preset = workdir / "models.ini"
    text = preset_ini(doc, host, port)
    write_atomic(preset, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return router_argv(str(bin_dir / LLAMA_SERVER) if bin_dir else LLAMA_SERVER, preset, doc, host, port)


def serve_set(doc: dict[str, Any], bin_dir: Path | None, host: str, port: int, workdir: Path,
              on_ready: Callable[[int, str, list[InstanceCheck]], None], log_path: Path | None = None
              ) -> list[InstanceCheck]:
    """Run the router until it stops (SIGINT/SIGTERM are forwarded to it); `on_ready(pid, url, checks)`
    once the resident models are loaded. Returns every instance's check as it stopped."""
    port = port or free_port()
    argv = prepare_router(doc, bin_dir, host, port, workdir)
    log_path = log_path or workdir / "router.log"
    with open(log_path, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    resident = [m["name"] for m in doc["models"] if m["resident"]]
    try:
        with forward_signals(proc):
            _wait_resident(proc, port, resident, log_path)
            logs = instance_logs(log_path.read_text(errors="replace"))
            on_ready(proc.pid, f"http://{host}:{port}", [check_instance(doc, n, logs[n]) for n in resident])
            proc.wait()
    finally:
        stop_process(proc)
    logs = instance_logs(log_path.read_text(errors="replace"))
    return [check_instance(doc, n, text) for n, text in logs.items()]
