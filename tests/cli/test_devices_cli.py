"""`fitplan devices` end to end through the CLI entry point (no GPU needed)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from planner.cli import main

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["devices", *args])
    out, err = capsys.readouterr()
    return code, out, err


def meminfo_bytes(key: str) -> int:
    m = re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.MULTILINE)
    return int(m.group(1)) * 1024


@pytest.mark.parametrize("extra", [[], ["--no-llama"]])
def test_this_machine_lists_host_ram_as_proc_meminfo(capsys, extra):
    code, out, _ = run(capsys, "--format", "json", *extra)
    assert code == 0
    host = json.loads(out)["host"]
    assert host["ram_total_bytes"] == meminfo_bytes("MemTotal")
    # MemAvailable moves while tests run; it must agree to within 512 MiB.
    assert abs(host["ram_available_bytes"] - meminfo_bytes("MemAvailable")) < 512 * 2**20
    cpuinfo = Path("/proc/cpuinfo").read_text()
    m = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    if m:
        assert host["cpu_model"] == m.group(1).strip()


def test_table_shows_host_row_and_cpu(capsys):
    code, out, _ = run(capsys, "--no-llama")
    assert code == 0
    assert re.search(r"^Host\s+cpu\s+CPU\s", out, re.MULTILINE)
    assert "CPU: " in out


def test_yaml_inventory_budgets_and_llama_flags(capsys):
    code, out, _ = run(capsys, "--devices", str(ROOT / "configs/devices/rpc-two-hosts.yaml"),
                       "--max-vram", "gpu=20,RPC1=-2", "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["device_order"] == ["RPC0", "RPC1", "CUDA0"]
    # rtx3090/rtx4090 catalog memory is 24 GiB with free = total: RPC0 keeps the 512 MiB default,
    # RPC1 is free - 2 GiB, CUDA0 (`gpu`) is 20 GiB -> margins 512, 2048, 4096 MiB.
    assert [d["budget_bytes"] for d in doc["devices"]] == [24 * GIB - 512 * 2**20, 22 * GIB, 20 * GIB]
    assert doc["llama_flags"] == "--rpc 192.168.1.21:50052,192.168.1.22:50052 --fit-target 512,2048,4096"


def test_shorthands_on_the_command_line(capsys):
    code, out, _ = run(capsys, "--no-llama", "--device", "2xrtx3090", "--ram", "64GiB", "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["device_order"] == ["CUDA0", "CUDA1"]
    assert doc["host"]["ram_total_bytes"] == 64 * GIB


@pytest.mark.parametrize("args, expected", [
    (["--max-vram", "abc"], "expected a number of GiB"),
    (["--max-vram", "=3"], "missing device name before '='"),
    (["--max-vram", "CUDA9=4"], "no device 'CUDA9': expected one of CUDA0, CUDA1, gpu"),
    (["--device", "abc"], "expected NAME=SIZE (CUDA0=24GiB)"),
    (["--max-ram", "x"], "expected a number of GiB"),
])
def test_bad_values_exit_2_with_one_line(capsys, args, expected):
    code, out, err = run(capsys, "--devices", str(ROOT / "configs/devices/workstation-2x3090.yaml"), *args)
    assert code == 2
    assert out == "" and len(err.strip().splitlines()) == 1 and expected in err, err


def test_misspelled_yaml_key_exits_2(capsys, tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("host:\n  ram: 32GiB\n  availabel: 30GiB\n")
    code, _, err = run(capsys, "--devices", str(path))
    assert code == 2
    assert f"{path}: host.availabel: unknown key (did you mean 'available'?)" in err


def test_rpc_with_a_yaml_inventory_is_refused(capsys):
    code, _, err = run(capsys, "--devices", str(ROOT / "configs/devices/cpu-only.yaml"), "--rpc", "127.0.0.1:1")
    assert code == 2 and "expected either --devices" in err


def test_rpc_endpoint_without_a_server_exits_2(capsys):
    from planner.system.llama_tools import free_port

    endpoint = f"127.0.0.1:{free_port()}"       # nothing listens there
    code, _, err = run(capsys, "--rpc", endpoint)
    assert code == 2 and f"--rpc {endpoint}: cannot connect" in err and "expected a running rpc-server" in err


def test_bare_negative_max_vram_is_not_taken_for_an_option(capsys):
    # workstation-2x3090.yaml: both cards have 23.5 GiB free; "-2" leaves 2 GiB free on each.
    code, out, _ = run(capsys, "--devices", str(ROOT / "configs/devices/workstation-2x3090.yaml"),
                       "--max-vram", "-2", "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert [d["budget_bytes"] for d in doc["devices"]] == [int(21.5 * GIB)] * 2
    assert doc["llama_flags"] == "--fit-target 2048,2048"
