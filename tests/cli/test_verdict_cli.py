"""`fitplan plan --verdict --clients N` on the command line: the ranking, the winner's commands, the
formats, and the options it refuses."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from gguf import Keys

from planner.cli import main
from planner.synth.gguf_factory import llama_spec

TWO_RPC = ["--device", "RPC0=2GiB@127.0.0.1:50052", "--device", "RPC1=2GiB@127.0.0.1:50053", "--ram", "8GiB",
           "--ctx", "4096"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_table_ranks_and_prints_one_server_line_per_endpoint(capsys):
    code, out, _ = run(capsys, "plan", "example:gemma3-270m", *TWO_RPC, "--verdict", "--clients", "4")
    assert code == 0
    assert "ranking for 4 clients: (a)" in out
    servers = [line.strip() for line in out.splitlines() if line.strip().startswith("llama-server ")]
    assert len(servers) == 2
    assert "what would not help:" in out and "why:" not in out


def test_json_names_the_winner_and_its_commands(capsys):
    code, out, _ = run(capsys, "plan", "example:gemma3-270m", *TWO_RPC, "--verdict", "--clients", "4",
                       "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["winner"] == "endpoints" and doc["clients"] == 4 and doc["ctx_per_client"] == 4096
    assert [o["arrangement"] for o in doc["options"]] == ["endpoints", "split", "offload"]
    ports = [e["port"] for e in doc["options"][0]["endpoints"]]
    assert ports == [8080, 8081]
    for command, endpoint in zip(doc["commands"], doc["options"][0]["endpoints"], strict=True):
        assert shlex.split(command) == ["llama-server", *endpoint["argv"]]


def test_command_format_prints_only_the_winners_lines(capsys):
    code, out, _ = run(capsys, "plan", "example:gemma3-270m", *TWO_RPC, "--verdict", "--clients", "2",
                       "--format", "command")
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 2 and all(shlex.split(line)[0] == "llama-server" for line in lines)


def test_explain_adds_the_arithmetic(capsys):
    code, out, _ = run(capsys, "plan", "example:gemma3-270m", *TWO_RPC, "--verdict", "--explain")
    assert code == 0
    assert "why:" in out and "boundary(ies)" in out


def test_refusals(capsys):
    code, _, err = run(capsys, "plan", "example:gemma3-270m", *TWO_RPC, "--clients", "4")
    assert code == 2 and "--verdict" in err
    one = ["--device", "RPC0=2GiB@127.0.0.1:50052", "--ram", "8GiB", "--ctx", "4096"]
    code, _, err = run(capsys, "plan", "example:gemma3-270m", *one, "--verdict")
    assert code == 2 and "several devices" in err
    code, _, err = run(capsys, "plan", "example:gemma3-270m", *TWO_RPC, "--verdict", "--format", "flags")
    assert code == 2


def test_four_clients_of_a_32k_model_warn_only_past_each_clients_context(tmp_path):
    """Issue 39: `--verdict --clients 4` on a 32k-context model warned "context 131072 is above the model's
    training context" (four slots' total; llama.cpp compares each sequence's n_ctx_seq), each warning twice
    (once per arrangement's plan). Run as a user runs it, so stderr is what the terminal shows."""
    spec = llama_spec(n_layer=2)
    spec.metadata[Keys.LLM.CONTEXT_LENGTH] = 32768
    [model] = spec.write(tmp_path / "ctx32k.gguf")
    devices = ["--device", "RPC0=8GiB@127.0.0.1:50052", "--device", "RPC1=8GiB@127.0.0.1:50053", "--ram", "8GiB"]
    for ctx, warnings in (([], 0), (["--ctx", "65536"], 1)):
        run = subprocess.run([sys.executable, "-m", "planner.cli", "plan", str(model), *devices, *ctx,
                              "--verdict", "--clients", "4"], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        assert run.returncode == 0, run.stderr
        said = [line for line in run.stderr.splitlines() if "training context" in line]
        assert len(said) == warnings, run.stderr
        assert all(line.startswith("fitplan: context 65536 is above") for line in said)
