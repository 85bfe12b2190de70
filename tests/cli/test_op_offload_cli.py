"""Op offload as a decision: a CUDA example, planned and then validated.

On a CUDA-class inventory a host weight's matmul runs on the first GPU once the batch reaches
GGML_OP_OFFLOAD_MIN_BATCH (seed 000 1.off), staging the weight and its result in that GPU's compute
buffer. Gemma 3 270M's tied output matrix (token_embd, 262144 x 640 Q8_0, 170 MiB) kept on the host
with `-ot ^token_embd\\.weight=CPU`: in llama-fit-params' dry run the prompt graph computes 512 rows of
logits, so its output matmul is offloaded and puts the matrix and 512 MiB of logits on CUDA0; llama-server
reserves one output row per slot, a batch of one that stays on the host. A plan sizes llama-server's
load (planner/llama/programs.py), so op offload is a question of speed there, and validate agrees.
"""
from __future__ import annotations

import yaml

from planner.cli import main
from tests.support.overhead import cuda

EXAMPLE = ["plan", "example:gemma3-270m", "--device", "CUDA0=2GiB", "--device", "CUDA1=1GiB", "--ram", "16GiB",
           "--max-vram", f"CUDA0={cuda(90)},CUDA1={cuda(40)}", "-c", "8192", "-ub", "512"]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_plan_fits_and_validate_confirms(capsys, tmp_path):
    plan_file = tmp_path / "p.yaml"
    code, out, err = _run(capsys, *EXAMPLE, "--explain", "-o", str(plan_file))
    assert code == 0, err
    doc = yaml.safe_load(plan_file.read_text())
    assert r"^token_embd\.weight=CPU" in doc["flags"]
    assert doc["compute_model"] == "simulated"
    assert "op offload" in out   # the decision is stated either way
    for reserve_only in ([], ["--reserve-only"]):
        code, out, err = _run(capsys, "validate", str(plan_file), *reserve_only)
        assert code == 0, out + err
        assert "verdict: fits; matches the estimate" in out


def test_op_offload_on_fits_llama_servers_load_not_the_dry_run(capsys, tmp_path):
    code, out, err = _run(capsys, *EXAMPLE, "--op-offload", "on", "-o", str(tmp_path / "p.yaml"))
    assert code == 0, err
    doc = yaml.safe_load((tmp_path / "p.yaml").read_text())
    assert "--no-op-offload" not in doc["argv"]
    code, out, err = _run(capsys, "validate", str(tmp_path / "p.yaml"), "--reserve-only")
    assert code == 0 and "verdict: fits" in out, out + err
    # the same flags in llama-fit-params' dry run: the staged matrix and 512 rows of logits on CUDA0
    flags = [a for a in doc["argv"][1:] if a != "-m"]
    model = doc["argv"][doc["argv"].index("-m") + 1]
    code, out, err = _run(capsys, "estimate", model, "--device", "CUDA0=2GiB", "--device", "CUDA1=1GiB",
                          "--format", "json", "--program", "fit-params", "--", *flags[flags.index(model) + 1:])
    assert code == 0, err
    cuda0 = next(d for d in yaml.safe_load(out)["devices"] if d["name"] == "CUDA0")
    assert cuda0["compute_bytes"] > 512 * 2**20


def test_op_offload_option_values(capsys):
    code, out, err = _run(capsys, *EXAMPLE, "--op-offload", "maybe")
    assert code == 2 and "--op-offload 'maybe'" in err and "Traceback" not in err
