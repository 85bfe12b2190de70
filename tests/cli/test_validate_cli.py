"""`fitplan validate` through the CLI on a tiny real-weight llama (planner/synth/tiny_models.py).

Its weights by hand (Q8_0: 32 values in 34 bytes, so a 64-wide row is 68 bytes and a 128-wide row
136; f32 rows 4 bytes a value; every size here is already a multiple of the 32-byte alignment):
  token_embd Q8_0 64x256 = 17408; output_norm f32 64 = 256; output Q8_0 64x256 = 17408;
  per layer: attn_norm 256, q Q8_0 64x128 = 8704, k Q8_0 64x64 = 4352, v f32 64x64 = 16384,
  o Q8_0 128x64 = 8704, ffn_norm 256, gate 8704, up 8704, down Q8_0 128x64 = 8704 -> 64768.
  All on the CPU (-ngl 0): 35072 + 2 x 64768 = 164608.
KV with -c 256: 2 layers x (K + V) x 64 values (2 heads x 32) x 2 bytes x 256 cells = 131072.
Two equal rpc devices with every layer offloaded: layers 0 and 1 on RPC0, the output layer
(index 2 of 3) on RPC1 (llama.cpp's cumulative-share rule), token_embd on the host.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from gguf import Keys

from planner.cli import main
from planner.synth.gguf_factory import add_tokenizer, llama_spec
from planner.synth.tiny_models import write_tiny

HOST_WEIGHTS = 164608
LAYER_WEIGHTS = 64768
KV = 131072
RPC = "127.0.0.1:50001,127.0.0.1:50002"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(write_tiny(tmp_path_factory.mktemp("m") / "tiny-llama.gguf", "llama"))


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["validate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cpu_run_reports_the_bytes_it_allocated(capsys, model: str) -> None:
    code, out, err = _run(capsys, model, "--format", "json", "--prompt-tokens", "8", "--gen-tokens", "3",
                          "--", "-c", "256", "-ngl", "0")
    assert code == 0, err
    doc = json.loads(out)
    [host] = doc["devices"]
    assert (host["name"], host["weights_bytes"], host["kv_bytes"]) == ("Host", HOST_WEIGHTS, KV)
    assert host["predicted"]["model_bytes"] == HOST_WEIGHTS and host["predicted"]["context_bytes"] == KV
    assert doc["splits"] == {"prompt": 1, "generation": 1}
    assert doc["copied_bytes_per_token"] == 0   # one device: nothing crosses
    assert doc["fits"] is True and doc["verdict"].startswith("fits")


def _plan(tmp_path: Path, model: str, rpc0_budget: int) -> str:
    """A deployment file as `fitplan plan -o` writes it (planner/emit/document.py deployment())."""
    device = {"kind": "rpc", "backend": "RPC", "total_bytes": 1 << 30, "free_bytes": 1 << 30, "bandwidth_bytes_s": 0,
              "fp16_flops": 0, "link_bytes_s": 0}
    doc = {"fitplan_deployment": 1, "model": {"path": model},
           "inventory": {"devices": [dict(device, name="RPC0", endpoint="127.0.0.1:50001"),
                                     dict(device, name="RPC1", endpoint="127.0.0.1:50002")],
                         "host": {"ram_total_bytes": 1 << 34, "ram_available_bytes": 1 << 34,
                                  "bandwidth_bytes_s": 0, "cpu_model": "test"}},
           "budgets": {"devices": {"RPC0": rpc0_budget, "RPC1": 1 << 30}, "host_bytes": 1 << 32},
           "flags": f"--rpc {RPC} -ngl 99 -c 256"}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_bit_exact_kernels_run_the_same_placement(capsys, model: str) -> None:
    """--kernels ggml-avx2 changes how the numbers are computed, not where anything lives."""
    docs = []
    for kernels in ("default", "ggml-avx2"):
        code, out, err = _run(capsys, model, "--kernels", kernels, "--format", "json", "--prompt-tokens", "8",
                              "--gen-tokens", "2", "--", "-c", "256", "-ngl", "0")
        assert code == 0, err
        docs.append(json.loads(out))
    assert [d["weights_bytes"] for d in docs[0]["devices"]] == [d["weights_bytes"] for d in docs[1]["devices"]]
    assert docs[1]["devices"][-1]["weights_bytes"] == HOST_WEIGHTS
    assert docs[0]["splits"] == docs[1]["splits"]


def test_plan_file_split_over_two_devices(capsys, model: str, tmp_path: Path) -> None:
    code, out, err = _run(capsys, _plan(tmp_path, model, 1 << 30), "--format", "json", "--gen-tokens", "2")
    assert code == 0, err
    doc = json.loads(out)
    rows = {d["name"]: d for d in doc["devices"]}
    assert rows["RPC0"]["weights_bytes"] == 2 * LAYER_WEIGHTS
    assert rows["RPC1"]["weights_bytes"] == 256 + 17408          # output_norm + output
    assert rows["Host"]["weights_bytes"] == 17408                  # token_embd stays on the CPU
    assert rows["RPC0"]["kv_bytes"] == KV and rows["RPC1"]["kv_bytes"] == 0
    assert doc["splits"]["generation"] >= 3                        # CPU embeddings -> RPC0 -> RPC1
    assert doc["copied_bytes_per_token"] > 0


def test_budget_too_small_is_a_verdict_not_a_traceback(capsys, model: str, tmp_path: Path) -> None:
    # RPC0's first buffer is its weights, 129536 bytes, against 65536: short by 64000 bytes
    code, out, err = _run(capsys, _plan(tmp_path, model, 65536), "--format", "json")
    assert code == 1
    doc = json.loads(out)
    assert doc["fits"] is False
    assert doc["verdict"] == "does not fit on RPC0 by 1 MiB"       # fmt_mib rounds up, as llama.cpp
    assert "(64000 bytes)" in doc["notes"][0]
    assert "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["--engine", "vulkan", "M", "--", "-c", "256"], "--engine 'vulkan'"),
    (["M", "--", "-c", "256", "--bogus"], "unknown llama.cpp flag '--bogus'"),
    (["/nonexistent/plan.yaml"], "cannot read the plan"),
    (["PLAN", "--", "-c", "256"], "a plan file carries its own flags"),
    (["BADPLAN"], "not a fitplan plan file"),
    (["WRONGHASH"], "is not the model the plan was made for"),
    (["M", "--", "-c", "256", "-np", "2"], "the runtime decodes one sequence"),
    (["M", "--", "-c", "256", "-ctk", "q8_0", "-ctv", "q8_0"], "f16 and f32 KV caches only"),
    (["M", "--prompt-tokens", "250", "--", "-c", "256"], "do not fit the context of 256 tokens"),
    (["M", "--kernels", "fast", "--", "-c", "256"], "kernels 'fast': expected one of default, ggml-avx2"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, model: str, tmp_path: Path, argv: list[str], message: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: 3\n")
    wrong = tmp_path / "wrong.yaml"
    doc = yaml.safe_load(Path(_plan(tmp_path, model, 1 << 30)).read_text())
    doc["model"]["header_sha256"] = "0" * 64
    wrong.write_text(yaml.safe_dump(doc))
    subst = {"M": model, "PLAN": _plan(tmp_path, model, 1 << 30), "BADPLAN": str(bad), "WRONGHASH": str(wrong)}
    code, out, err = _run(capsys, *[subst.get(a, a) for a in argv])
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_nan_from_the_header_is_a_note_not_a_warning(tmp_path: Path) -> None:
    """An rms eps of 0 over zero weights makes 0/0, in ggml and here: the run says so in its report and no
    numpy warning reaches stderr (`-W error` turns one into a traceback; the fuzz harness found it)."""
    spec = llama_spec(n_layer=2, n_embd=256, n_head=8, n_head_kv=2)
    spec.metadata[Keys.Attention.LAYERNORM_RMS_EPS] = 0.0
    add_tokenizer(spec, 1000)
    [path] = spec.write(tmp_path / "eps0.gguf")        # tensor data all zeros
    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "planner.cli", "validate", str(path),
                           "--prompt-tokens", "8", "--gen-tokens", "2", "--", "-c", "256"],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2],
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "note: the last logits are not all finite (NaN or inf)" in done.stdout
