"""`fitplan devices` against real llama.cpp tools and two rpc-servers on loopback."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from planner.cli import main
from planner.registry.examples import resolve_model

pytestmark = pytest.mark.peer

MIB = 2**20
# assembled on first use, so a fresh machine (CI) runs these tests instead of skipping them
MODEL = Path(resolve_model("example:gemma3-270m"))


def fitplan_devices(capsys, *args: str) -> dict:
    code = main(["devices", "--format", "json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_rpc_devices_are_named_as_llama_cpp_names_them(capsys, llama_tools, rpc_pair):
    doc = fitplan_devices(capsys, "--rpc", ",".join(rpc_pair))
    ours = [(d["name"], d["endpoint"], d["total_bytes"] // MIB) for d in doc["devices"] if d["kind"] == "rpc"]
    listed = subprocess.run([str(llama_tools / "llama-cli"), "--rpc", ",".join(rpc_pair), "--list-devices"],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    theirs = [(m[0], m[1], int(m[2])) for m in re.findall(r"^\s+(RPC\d+): (\S+) \((\d+) MiB", listed, re.MULTILINE)]
    assert ours == theirs
    assert [name for name, _, _ in ours] == ["RPC0", "RPC1"]
    assert doc["llama_flags"].startswith(f"--rpc {','.join(rpc_pair)} ")


def test_device_order_matches_llama_cpp_model_devices(capsys, llama_tools, rpc_pair):
    doc = fitplan_devices(capsys, "--rpc", ",".join(rpc_pair))
    run = subprocess.run([str(llama_tools / "llama-fit-params"), "--rpc", ",".join(rpc_pair), "-v", "-m", str(MODEL)],
                         capture_output=True, text=True, timeout=300, check=True)
    # llama_prepare_model_devices logs "using device NAME (DESC) ..." once per device, in model order.
    used = re.findall(r"using device (\S+) \(", run.stdout + run.stderr)
    assert used == doc["device_order"]


def test_fit_target_from_budgets_is_accepted_by_llama_cpp(capsys, llama_tools, rpc_pair):
    doc = fitplan_devices(capsys, "--rpc", ",".join(rpc_pair), "--max-vram", "RPC0=-1,RPC1=-2")
    flags = doc["llama_flags"].split()
    assert flags[flags.index("--fit-target") + 1] == "1024,2048"
    run = subprocess.run([str(llama_tools / "llama-fit-params"), *flags, "-m", str(MODEL)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]


def test_rpc_servers_stop_when_the_body_raises(llama_tools):
    import socket

    from planner.system.llama_tools import rpc_servers

    with pytest.raises(RuntimeError, match="boom"), rpc_servers(2, llama_tools) as endpoints:
        assert all(ep.startswith("127.0.0.1:") for ep in endpoints)
        raise RuntimeError("boom")
    for ep in endpoints:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", int(ep.rsplit(":", 1)[1])), timeout=1).close()


def test_a_pinned_rpc_server_on_loopback_is_detected_with_its_cpus_and_threads(capsys, llama_tools):
    # two real rpc-servers: one under `taskset -c LAST` with rpc-server's default threads (half the
    # online CPUs, at least one), one free with -t 1; detection reads their affinity and command lines
    import os

    from planner.hardware.inventory_yaml import cpu_list_text
    from planner.hardware.local_servers import default_threads
    from planner.system.llama_tools import rpc_servers

    last = max(os.sched_getaffinity(0))
    with rpc_servers(1, llama_tools, prefix=lambda i: ["taskset", "-c", str(last)]) as pinned, \
            rpc_servers(1, llama_tools, args=["-t", "1"]) as free:
        doc = fitplan_devices(capsys, "--rpc", ",".join(pinned + free))
        assert main(["devices", "--rpc", ",".join(pinned + free)]) == 0
        text = capsys.readouterr().out
    assert f"{free[0]} (cpus {cpu_list_text(tuple(sorted(os.sched_getaffinity(0))))}, 1 thread)" in text
    rows = {d["endpoint"]: d for d in doc["devices"] if d["kind"] == "rpc"}
    assert rows[pinned[0]]["cpus"] == [last]
    assert rows[pinned[0]]["threads"] == default_threads(os.cpu_count() or 1)
    assert rows[free[0]]["cpus"] == sorted(os.sched_getaffinity(0)) and rows[free[0]]["threads"] == 1
