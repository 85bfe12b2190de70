"""One set of inventory options (issue 17): plan, estimate, validate, sweep and devices take the same
--devices, --device, --ram, --rpc, --max-vram and --max-ram, with the same meaning and errors."""
from __future__ import annotations

import json

import pytest

from planner.cli import main
from planner.cli.options import with_inventory_flags
from planner.core.units import GiB, MiB
from tests.support.overhead import CUDA_MIB, cuda

OPTIONS = ("--devices", "--device", "--ram", "--rpc", "--max-vram", "--max-ram")
MODEL = "example:gemma3-270m"
# each command as it is run with a model and llama.cpp flags where it takes them
COMMANDS = {
    "plan": ["plan", MODEL, "--ctx", "1024"],
    "estimate": ["estimate", MODEL],
    "validate": ["validate", MODEL, "--reserve-only"],
    "sweep": ["sweep", MODEL, "--vary", "ctx=512,1024", "--format", "json"],
    "devices": ["devices"],
}
FLAGS = {"estimate": ["--", "-c", "1024"], "validate": ["--", "-c", "1024"], "sweep": ["--", "-ngl", "99"]}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_lists_the_six_options(capsys, command):
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    for option in OPTIONS:
        assert option in out, (command, option)


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unreachable_rpc_server_is_the_same_error_everywhere(capsys, command):
    code, _, err = run(capsys, *COMMANDS[command], "--rpc", "127.0.0.1:1", *FLAGS.get(command, []))
    assert code == 2 and "--rpc 127.0.0.1:1: cannot connect" in err, err


@pytest.mark.parametrize("command", ["estimate", "validate", "sweep"])
def test_budgets_need_devices(capsys, command):
    code, _, err = run(capsys, *COMMANDS[command], "--max-vram", "1", *FLAGS.get(command, []))
    assert code == 2 and "--max-vram/--max-ram: budgets are relative to devices" in err, err


# a 1 GiB card and a 512 MiB budget, each beside the CUDA overhead a plan counts within the budget
SHORTHANDS = ["--device", f"CUDA0={cuda(1024)}", "--ram", "8GiB", "--max-vram", f"CUDA0={cuda(512)}", "--max-ram",
              "4GiB"]
BUDGET = (512 + CUDA_MIB) * MiB


def test_devices_reports_the_budgets(capsys):
    code, out, _ = run(capsys, "devices", "--format", "json", "--no-llama", *SHORTHANDS)
    assert code == 0
    doc = json.loads(out)
    assert doc["devices"][0]["budget_bytes"] == BUDGET and doc["host"]["budget_bytes"] == 4 * GiB


def test_estimate_checks_the_flags_against_the_budgets(capsys):
    code, out, _ = run(capsys, "estimate", MODEL, "--format", "json", *SHORTHANDS, "--", "-c", "1024", "-ngl", "99")
    doc = json.loads(out)
    assert doc["budgets"] == {"CUDA0": BUDGET, "Host": 4 * GiB}
    cuda0 = next(d for d in doc["devices"] if d["name"] == "CUDA0")
    within = sum(cuda0[k] for k in ("model_bytes", "context_bytes", "compute_bytes", "overhead_bytes")) <= BUDGET
    assert doc["fits"] is within and code == (0 if within else 1)
    code, out, _ = run(capsys, "estimate", MODEL, "--device", "CUDA0=1GiB", "--max-vram", "CUDA0=16MiB",
                       "--", "-c", "1024", "-ngl", "99")
    assert code == 1 and "does not fit on CUDA0" in out


def test_sweep_fills_budgets_from_max_vram(capsys):
    code, out, err = run(capsys, *COMMANDS["sweep"], *SHORTHANDS, "--", "-ngl", "99")
    assert code == 0, err
    rows = [r for p in json.loads(out)["points"] for r in p["devices"]]
    budgets = {r["name"]: r["budget_bytes"] for r in rows}
    assert budgets["CUDA0"] == BUDGET and budgets["Host"] == 4 * GiB


def test_validate_takes_the_device_shorthands(capsys):
    # -ngl 0: CUDA0 holds only op offload's staging of the host weights (~690 MiB)
    code, out, err = run(capsys, *COMMANDS["validate"], "--format", "json", "--device", "CUDA0=2GiB", "--ram", "8GiB",
                         "--max-vram", "CUDA0=1GiB", "--max-ram", "4GiB", "--", "-c", "1024", "-ngl", "0")
    assert code == 0, err
    budgets = {d["name"]: d["budget_bytes"] for d in json.loads(out)["devices"]}
    assert budgets["CUDA0"] == GiB and budgets["Host"] == 4 * GiB


def test_plan_takes_the_same_options(capsys):
    code, out, err = run(capsys, *COMMANDS["plan"], "--format", "json", *SHORTHANDS)
    assert code == 0, err
    doc = json.loads(out)
    assert {d["name"]: d["budget_bytes"] for d in doc["devices"]}["CUDA0"] == BUDGET


def test_a_plan_file_takes_no_inventory(capsys, tmp_path):
    target = tmp_path / "p.yaml"
    assert run(capsys, *COMMANDS["plan"], *SHORTHANDS, "-o", str(target))[0] == 0
    code, _, err = run(capsys, "validate", str(target), "--ram", "8GiB")
    assert code == 2 and "a plan file carries its own" in err


@pytest.mark.parametrize("command", ["choose", "plan-set", "serve"])
def test_the_other_machine_commands_list_the_six_options_too(capsys, command):
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    for option in OPTIONS:
        assert option in out, (command, option)


def test_with_inventory_flags_needs_an_inventory_parameter():
    def command(model: str) -> None:
        raise AssertionError("never called")

    with pytest.raises(TypeError, match="`inventory: InventoryFlags`"):
        with_inventory_flags(command)
