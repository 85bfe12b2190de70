"""`fitplan plan` on the command line: formats, the deployment file, exit codes."""
from __future__ import annotations

import json
import os

import yaml

from planner.cli import main
from planner.llama.flags import parse_llama_flags

TWO_RPC = ["--device", "RPC0=100MiB@127.0.0.1:50052", "--device", "RPC1=100MiB@127.0.0.1:50053",
           "--ram", "4GiB", "--max-vram", "RPC0=100MiB,RPC1=100MiB"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_flags_format_prints_one_parseable_line(capsys):
    code, out, _ = run(capsys, "plan", "example:gemma3-270m", *TWO_RPC, "--ctx", "4096", "--format", "flags")
    assert code == 0
    assert len(out.strip().splitlines()) == 1
    flags = parse_llama_flags(out.split())
    assert flags.n_ctx == 4096 and flags.rpc == ("127.0.0.1:50052", "127.0.0.1:50053")


def test_json_keeps_the_devices_contract(capsys):
    code, out, _ = run(capsys, "plan", "example:gemma3-270m", *TWO_RPC, "--ctx", "4096", "--format", "json")
    assert code == 0
    doc = json.loads(out)
    names = [d["name"] for d in doc["devices"]]
    assert names[:3] == ["RPC0", "RPC1", "Host"]
    for d in doc["devices"]:
        assert all(isinstance(d[k], int) for k in ("model_bytes", "context_bytes", "compute_bytes"))
        if d["budget_bytes"] is not None:
            assert d["total_bytes"] <= d["budget_bytes"]
    assert doc["ctx"] == 4096 and isinstance(doc["flags"], str)
    assert doc["predicted"]["decode_tokens_s"] > 0


def test_output_file_is_a_complete_deployment(capsys, tmp_path):
    target = tmp_path / "plan.yaml"
    code, _, _ = run(capsys, "plan", "example:gemma3-270m", *TWO_RPC, "--ctx", "4096", "-o", str(target))
    assert code == 0
    doc = yaml.safe_load(target.read_text())
    assert doc["fitplan_deployment"] == 1
    assert len(doc["model"]["header_sha256"]) == 64
    assert doc["flags"].startswith("--rpc ")
    assert doc["budgets"]["devices"] == {"RPC0": 100 * 2**20, "RPC1": 100 * 2**20}
    assert [p for p in os.listdir(tmp_path) if p.startswith(".fitplan-")] == []  # no temporary left


def test_explain_names_headroom_per_device(capsys):
    code, out, _ = run(capsys, "plan", "example:gemma3-270m", *TWO_RPC, "--ctx", "4096", "--explain")
    assert code == 0
    assert "why:" in out and "RPC0:" in out and "headroom" in out


def test_infeasible_exits_1_with_what_would_fit(capsys):
    code, _, err = run(capsys, "plan", "example:gemma3-270m", "--device", "CUDA0=64MiB", "--ram", "700MiB",
                       "--max-ram", "400MiB", "--ctx", "32768")
    assert code == 1
    lines = err.strip().splitlines()
    assert lines[0].startswith("fitplan: error: no placement")
    assert "needs a budget of" in lines[0]
    assert lines[1].startswith("fitplan: what would fit:")
    assert "Traceback" not in err


def test_bad_values_exit_2(capsys):
    for argv, word in ((["--ctx", "lots"], "--ctx"), (["--objective", "fastest"], "--objective"),
                       (["--format", "xml"], "--format"), (["--solver", "simplex"], "--solver")):
        code, _, err = run(capsys, "plan", "example:gemma3-270m", *TWO_RPC, *argv)
        assert code == 2, argv
        assert word in err and "Traceback" not in err
