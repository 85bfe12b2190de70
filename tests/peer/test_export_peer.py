"""`fitplan export --to preset` read back by the pinned llama-server: in router mode
(`--models-preset FILE`) it loads the preset at startup (load-on-startup) and logs the argument
vector it gives the model's instance (tools/server/server-models.cpp); parsed, that vector is the
plan's placement, -ot lists joined and switches turned back into flags."""
from __future__ import annotations

import re
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from planner.cli import main
from planner.emit.document import read_deployment
from planner.emit.exports import export
from planner.llama.flags import parse_llama_flags
from planner.system.llama_tools import LOOPBACK, free_port, stop_process

pytestmark = pytest.mark.peer

EXTRA = ("-ot", r"token_embd\.weight=CPU", "-ot", "output_norm=CPU", "-nkvo")
ROUTER_SETS = {"--host", "--port", "--alias"}   # server-models.cpp update_args: the instance's own


def _instance_args(log: Path, timeout_s: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if "spawning server instance with args:" in text and "listening on" in text:
            block = text.split("spawning server instance with args:\n", 1)[1]
            args = []
            for line in block.splitlines():
                m = re.match(r"^\S+ I srv +load:   (.*)$", line)
                if not m:
                    break
                args.append(m.group(1))
            return args
        time.sleep(0.2)
    raise AssertionError(log.read_text(errors="replace")[-2000:])


def test_preset_read_back_by_llama_server(llama_tools: Path, rpc_pair: list[str], tmp_path: Path, capsys):
    plan_path = tmp_path / "plan.yaml"
    assert main(["plan", "example:gemma3-270m", "--device", f"RPC0=1GiB@{rpc_pair[0]}",
                 "--device", f"RPC1=1GiB@{rpc_pair[1]}", "--ram", "8GiB", "-c", "2048", "-o", str(plan_path)]) == 0
    capsys.readouterr()
    plan = read_deployment(str(plan_path))
    argv = (*plan.argv, *EXTRA)
    dep = replace(plan, argv=argv, flags=parse_llama_flags(list(plan.flag_argv) + list(EXTRA)))
    ini = tmp_path / "presets.ini"
    ini.write_text(export(dep, "preset"))
    log = tmp_path / "router.log"
    with open(log, "w") as out:
        router = subprocess.Popen([str(llama_tools / "llama-server"), "--models-preset", str(ini), "--host", LOOPBACK,
                                   "--port", str(free_port())], stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
    try:
        args = _instance_args(log)
    finally:
        stop_process(router)
    assert args[0] == str(llama_tools / "llama-server")
    rest, i, model = [], 1, None
    while i < len(args):
        if args[i] in ROUTER_SETS:
            i += 2
            continue
        if args[i] == "--model":
            model = args[i + 1]
            i += 2
            continue
        rest.append(args[i])
        i += 1
    assert model == plan.model_path
    got = parse_llama_flags(rest)
    assert got.overrides == dep.flags.overrides   # one -ot list, same patterns in the same order
    assert replace(got, override_args=(), ignored=()) == replace(dep.flags, override_args=(), ignored=())
    assert rest[rest.index("--fit") + 1] == "off"   # an option fitplan ignores, spelled long
    assert r"token_embd\.weight=CPU,output_norm=CPU" in rest and "--no-kv-offload" in rest
