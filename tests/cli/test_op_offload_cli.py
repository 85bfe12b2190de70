"""Op offload as a decision: the README's CUDA example, planned and then validated.

On a CUDA-class inventory a host weight's matmul runs on the first GPU once the batch reaches
GGML_OP_OFFLOAD_MIN_BATCH (seed 000 1.off), staging the weight and its result in that GPU's compute
buffer. Gemma 3 270M's tied output matrix (token_embd, 262144 x 640 Q8_0, 170 MiB) kept on the host
with `-ot ^token_embd\\.weight=CPU` would put itself and 512 rows of logits (512 MiB) on CUDA0: a
90 MiB budget cannot take that, so the plan must say `--no-op-offload`, and validate must agree.
"""
from __future__ import annotations

import yaml

from planner.cli import main

EXAMPLE = ["plan", "example:gemma3-270m", "--device", "CUDA0=2GiB", "--device", "CUDA1=1GiB", "--ram", "16GiB",
           "--max-vram", "CUDA0=90MiB,CUDA1=40MiB", "-c", "8192", "-ub", "512"]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_readme_cuda_example_plans_what_validate_confirms(capsys, tmp_path):
    plan_file = tmp_path / "p.yaml"
    code, out, err = _run(capsys, *EXAMPLE, "--explain", "-o", str(plan_file))
    assert code == 0, err
    doc = yaml.safe_load(plan_file.read_text())
    assert "--no-op-offload" in doc["flags"].split() and r"^token_embd\.weight=CPU" in doc["flags"]
    assert "-nopo 1" in doc["llama_bench_flags"]
    assert doc["compute_model"] == "simulated"
    assert "op offload off (--no-op-offload)" in out and "would not fit (CUDA0)" in out
    for reserve_only in ([], ["--reserve-only"]):
        code, out, err = _run(capsys, "validate", str(plan_file), *reserve_only)
        assert code == 0, out + err
        assert "verdict: fits; matches the estimate" in out


def test_forcing_op_offload_on_is_infeasible_with_the_staging_named(capsys):
    code, out, err = _run(capsys, *EXAMPLE, "--op-offload", "on")
    assert code == 1
    assert "CUDA0 needs a budget of" in err


def test_the_same_flags_with_op_offload_do_not_fit_in_validate(capsys, tmp_path):
    # the flags the planner printed before this issue: validate, like llama.cpp, stages the output
    # matrix (170 MiB + padding) and 512 rows of 262144 logits (512 MiB) in CUDA0's compute buffer
    code, out, err = _run(capsys, *EXAMPLE, "-o", str(tmp_path / "p.yaml"))
    assert code == 0, err
    doc = yaml.safe_load((tmp_path / "p.yaml").read_text())
    doc["argv"] = [a for a in doc["argv"] if a != "--no-op-offload"]   # readers use argv, not flags
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(doc))
    code, out, err = _run(capsys, "validate", str(tmp_path / "q.yaml"), "--reserve-only")
    assert code == 1
    assert "does not fit on CUDA0" in out


def test_op_offload_option_values(capsys):
    code, out, err = _run(capsys, *EXAMPLE, "--op-offload", "maybe")
    assert code == 2 and "--op-offload 'maybe'" in err and "Traceback" not in err
