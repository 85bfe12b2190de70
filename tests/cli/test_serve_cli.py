"""`fitplan serve` through the CLI without starting llama-server: the command it would run, extra
flags re-estimated against the plan's budgets, and plans made for other hardware refused."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from planner.cli import main
from planner.hardware.inventory import HostSpec, Inventory
from planner.registry.examples import resolve_model
from planner.running import serve as serve_lib

RPC0, RPC1 = "127.0.0.1:50001", "127.0.0.1:50002"
GIB = 2**30


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("serve") / "plan.yaml"
    code = main(["plan", "example:gemma3-270m", "--device", f"RPC0=1GiB@{RPC0}", "--device", f"RPC1=1GiB@{RPC1}",
                 "--ram", "8GiB", "-c", "2048", "-o", str(path), "--format", "json"])
    assert code == 0
    return path


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["serve", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_run_prints_the_command(plan_file, capsys, tmp_path):
    (tmp_path / "llama-server").write_text("")
    code, out, err = _run(capsys, str(plan_file), "--dry-run", "--llama-bin", str(tmp_path), "--port", "8181",
                          "--", "-t", "2", "--api-key", "secret key")
    assert code == 0, err
    argv = shlex.split(out)
    assert argv[:3] == [str(tmp_path / "llama-server"), "-m", resolve_model("example:gemma3-270m")]
    assert argv[argv.index("--rpc") + 1] == f"{RPC0},{RPC1}"
    assert argv[argv.index("-np") + 1] == "1"             # stated: llama-server's default is 4 slots
    assert argv[argv.index("-c") + 1] == "2048"
    assert argv[argv.index("--api-key") + 1] == "secret key"
    assert argv[-6:] == ["--host", "127.0.0.1", "--port", "8181", "-lv", "4"]


def test_extra_flags_that_overrun_a_budget_are_refused(plan_file, capsys):
    code, out, err = _run(capsys, str(plan_file), "--dry-run", "--", "-c", "400000")
    assert code == 1
    assert err.count("\n") == 1 and "the plan no longer fits: RPC0 needs" in err and "budget is 512 MiB" in err


def test_extra_flags_that_still_fit_are_re_estimated(plan_file, capsys):
    code, out, err = _run(capsys, str(plan_file), "--dry-run", "--", "-c", "1024", "-np", "2")
    assert code == 0, err
    argv = shlex.split(out)
    assert argv[argv.index("-c") + 1] == "1024" and argv[argv.index("-np") + 1] == "2" and argv.count("-np") == 1


@pytest.mark.parametrize("extra", [["--port", "9"], ["-m", "other.gguf"], ["--no-such-flag"]])
def test_bad_extra_flags(plan_file, capsys, extra):
    code, _, err = _run(capsys, str(plan_file), "--dry-run", "--", *extra)
    assert code == 2 and err.count("\n") == 1


def test_other_hardware_is_refused(plan_file, capsys, monkeypatch):
    seen = []

    def here(rpc):
        seen.append(rpc)
        return Inventory((), HostSpec(8 * GIB, 8 * GIB, 0, ""))

    monkeypatch.setattr(serve_lib, "detect_inventory", here)
    code, out, err = _run(capsys, str(plan_file))
    assert code == 2
    assert seen == [[RPC0, RPC1]]   # the plan's rpc-servers are asked for
    assert err == (f"fitplan: error: {plan_file} was made for other hardware: the plan is for RPC0, RPC1; this "
                   f"machine has no GPU or RPC device (--force runs it anyway)\n")


def test_inventory_options_describe_this_machine(plan_file, capsys, monkeypatch):
    monkeypatch.setattr(serve_lib, "detect_inventory", lambda rpc: pytest.fail("described, not detected"))
    code, out, err = _run(capsys, str(plan_file), "--device", "CUDA0=24GiB", "--ram", "8GiB")
    assert code == 2
    assert "the plan is for RPC0, RPC1; this machine has CUDA0 (--force runs it anyway)" in err


def test_max_vram_replaces_the_plans_budgets(plan_file, capsys):
    # 0.125 GiB = 128 MiB on each RPC device: the device that holds more than that in the plan is named
    over = [d for d in yaml.safe_load(plan_file.read_text())["devices"] if d["name"].startswith("RPC")
            and d["total_bytes"] > 128 * 2**20]
    assert over
    code, out, err = _run(capsys, str(plan_file), "--dry-run", "--max-vram", "0.125")
    assert code == 1
    assert err.startswith(f"fitplan: error: with these budgets the plan no longer fits: {over[0]['name']} needs ")
    assert "its budget is 128 MiB" in err
