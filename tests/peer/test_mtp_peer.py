"""draft-mtp's context (planner/memory/mtp.py) against the pinned llama-server making it.

`--spec-type draft-mtp` without `-md`: llama-server loads the target with its nextn block, then makes a
second context on the same model ("creating MTP draft context against the target model") with its own
KV and compute buffer lines. llama-fit-params takes no --spec-type, so llama-server's log is the ground
truth: -fit off -v -lm none (host weights in a plain CPU buffer), stopped once it serves. The text before
that line is the target's load, the text after it the MTP context's (planner.running.tool_runs.parse_model_loads;
the second sched_reserve, which llama_set_sampler causes, logs the grown buffers). Files: small qwen35,
qwen35moe, qwen3next, glm4moe, hy_v3, deepseek2, deepseek32 and glm-dsa layouts with one MTP block, on the
host and over two and three loopback rpc-servers, with full and partial offload,
the drafter's q8_0 caches, -np 2, -fa off, -nkvo and a longer draft (qwen35's recurrent rollback rows grow
with --spec-draft-n-max; qwen3next keeps none: llm_arch_supports_rs_rollback); and at published widths
(Qwen3.5-27B, Qwen3.5-35B-A3B, GLM-4.5-Air with short trunks: the 248k and 152k vocabularies the MTP head's
logits and sampler rows are sized by). `plan --mtp`'s own command, loaded, holds the plan's rows.
Model and context rows equal llama.cpp's lines (two decimals of a MiB); compute within 3 % or 4 MiB and
never more than 1 MiB below (tests/support/estimate_matrix.py compute_ok).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import Keys

from planner.core.errors import FlagError
from planner.llama.context import model_context
from planner.llama.placement import CPU_REPACK, HOST
from planner.llama.programs import Program
from planner.memory.estimate import estimate
from planner.running.tool_runs import LOG_ROUNDING, parse_model_loads, rows_by_device, start_server, wait_ready
from planner.synth.gguf_factory import ModelSpec, Q, T, add_tokenizer, deepseek2_spec, tname
from planner.synth.glm4moe_factory import glm4moe_spec, glm45_air_like
from planner.synth.qwen3next_factory import qwen3next_spec, qwen35_spec
from planner.synth.shapes_common import tokenized
from planner.synth.shapes_hybrid import QWEN35_CTX, QWEN35_SECTIONS, QWEN35_VOCAB
from planner.synth.shapes_mla import dsa_layout
from planner.synth.shapes_moe26 import tiny_hy_v3
from planner.system.llama_tools import LOOPBACK, ToolsError, free_port, rpc_servers, stop_process
from tests.support.estimate_matrix import compute_ok

pytestmark = pytest.mark.peer

MIB = 2**20
ARCHS = ("qwen35", "qwen35moe", "qwen3next", "glm4moe", "hy_v3", "deepseek2", "deepseek32", "glm-dsa")
# qwen35*, qwen3next: the trunk is blocks 0-3 (block 3 full attention), block 4 the MTP block, 5 the output layer;
# glm4moe, deepseek2, deepseek32, glm-dsa: blocks 0-2 (block 0 dense), block 3 the MTP block (a MoE block),
# 4 the output layer; the DSA files' lightning indexer in every block (glm-dsa's own in blocks 0 and 2);
# hy_v3: planner/synth/shapes_moe26.py tiny_hy_v3 (its MTP block after the trunk)
FLAGS = {
    "host": "-c 4096",
    "rpc": "{rpc} -c 4096 -ts 1,1",
    "rpc 3,1": "{rpc} -c 4096 -ts 3,1",
    "partial": "{rpc} -c 4096 -ts 1,1 -ngl 3",
    "q8_0 draft cache": "{rpc} -c 4096 -ts 1,1 -ctkd q8_0 -ctvd q8_0",
    "-np 2": "{rpc} -c 8192 -ts 1,1 -np 2",
    "-fa off": "{rpc} -c 4096 -ts 1,1 -fa off",
    "-nkvo": "{rpc} -c 4096 -ts 1,1 -nkvo",
    "--spec-draft-n-max 6": "{rpc} -c 4096 -ts 1,1 --spec-draft-n-max 6",
    "no backend sampling": "{rpc} -c 4096 -ts 1,1 --no-spec-draft-backend-sampling",
}


@pytest.fixture(scope="module")
def mtp_files(shapes_dir: Path) -> dict[str, Path]:
    out = {}
    for arch in ARCHS:
        path = shapes_dir / f"{arch}-mtp.gguf"
        if not path.exists():
            spec = (glm4moe_spec(n_layer=3, n_nextn=1, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                                 n_expert=8, n_ff_exp=64, n_vocab=2048) if arch == "glm4moe"
                    else _with_nextn(deepseek2_spec(n_layer=4, n_vocab=2048), 3) if arch == "deepseek2"
                    else dsa_layout(_with_nextn(deepseek2_spec(n_layer=4, n_vocab=2048), 3), arch, n_index_head=4,
                                    index_head=64, top_k=256, index_full=(1, 0, 1) if arch == "glm-dsa" else None)
                    if arch in ("deepseek32", "glm-dsa")
                    else qwen3next_spec(n_mtp=1, n_vocab=2048) if arch == "qwen3next"
                    else tiny_hy_v3() if arch == "hy_v3"
                    else qwen35_spec(moe=arch == "qwen35moe", n_mtp=1, n_vocab=2048))
            if arch != "hy_v3":   # tiny_hy_v3 carries its own vocabulary
                add_tokenizer(spec, 2048, n_merges=1)
                spec.metadata[Keys.Tokenizer.PRE] = "default"
            spec.write(path)
        out[arch] = path
    return out


def _with_nextn(spec: ModelSpec, il: int) -> ModelSpec:
    """A deepseek2_spec's last block (`il`) as conversion/deepseek.py writes an MTP block: the block's tensors
    plus nextn.eh_proj, enorm, hnorm and shared_head_norm (deepseek2.cpp load_arch_tensors)."""
    n_embd = spec.metadata[Keys.LLM.EMBEDDING_LENGTH]
    spec.metadata[Keys.LLM.NEXTN_PREDICT_LAYERS] = 1
    spec.tensors += [(tname(T.NEXTN_EH_PROJ, il), Q.Q8_0, (2 * n_embd, n_embd)),
                     (tname(T.NEXTN_ENORM, il), Q.F32, (n_embd,)), (tname(T.NEXTN_HNORM, il), Q.F32, (n_embd,)),
                     (tname(T.NEXTN_SHARED_HEAD_NORM, il), Q.F32, (n_embd,))]
    return spec


def _serve(bin_dir: Path, model: Path, argv: list[str], log_path: Path) -> str:
    port = free_port()
    proc = start_server([str(bin_dir / "llama-server"), "-m", str(model), "--host", LOOPBACK, "--port", str(port),
                         "-fit", "off", "-v", "-lm", "none", *argv], log_path)
    try:
        wait_ready(proc, port, log_path, timeout_s=300)
    finally:
        stop_process(proc)
    return log_path.read_text(errors="replace")


def _rows(est_rows) -> dict[str, list[int]]:
    """Per llama.cpp row (CPU_REPACK is a host buffer too): model, context, compute bytes."""
    out: dict[str, list[int]] = {}
    for d in est_rows:
        acc = out.setdefault(HOST if d.name == CPU_REPACK else d.name, [0, 0, 0])
        acc[0], acc[1], acc[2] = acc[0] + d.model_bytes, acc[1] + d.context_bytes, acc[2] + d.compute_bytes
    return {row: v for row, v in out.items() if any(v)}


def _check(ours: dict[str, list[int]], theirs: dict[str, dict[str, int]], what: str) -> None:
    assert set(ours) == set(theirs), (what, ours, theirs)
    for row, kinds in theirs.items():
        model, context, compute = ours[row]
        assert abs(model - kinds.get("model", 0)) <= LOG_ROUNDING, (what, row, "model", model / MIB, kinds)
        assert abs(context - kinds.get("context", 0)) <= LOG_ROUNDING, (what, row, "context", context / MIB, kinds)
        assert compute_ok(compute / MIB, kinds.get("compute", 0) / MIB), (what, row, "compute", compute / MIB, kinds)


def _compare(llama_tools: Path, endpoints: list[str], model: Path, flags: str, tmp_path: Path) -> None:
    argv = ["-np", "1", "--spec-type", "draft-mtp"] + flags.replace("{rpc}", "--rpc " + ",".join(endpoints)).split()
    loads = parse_model_loads(_serve(llama_tools, model, argv, tmp_path / "server.log"))
    assert len(loads) == 2, "expected the target's load and the MTP context"
    names = {f"RPC{i}": ep for i, ep in enumerate(endpoints)}
    est = estimate(model_context(str(model)), argv, program=Program.SERVER)
    (mtp,) = [c for c in est.companions if c.kind == "mtp"]
    _check(_rows(est.devices), rows_by_device(loads[0], names), "target")
    _check(_rows(mtp.devices), rows_by_device(loads[1], names), "mtp")


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("case", list(FLAGS))
def test_mtp_context_rows_match_llama_server(llama_tools, rpc_endpoints, mtp_files, tmp_path, arch, case):
    _compare(llama_tools, rpc_endpoints, mtp_files[arch], FLAGS[case], tmp_path)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_mtp_context_over_three_rpc_servers(llama_tools, mtp_files, tmp_path, arch):
    with rpc_servers(3, llama_tools) as endpoints:
        _compare(llama_tools, endpoints, mtp_files[arch], "{rpc} -c 4096 -ts 1,1,2", tmp_path)


def test_mtp_kv_by_hand(mtp_files):
    """The MTP cache is the nextn block's alone: 4096 cells x (K, V) x 2 KV heads x 64 x f16 = 2 MiB, and
    with q8_0 (34 bytes per 32 values) 4096 x 2 x 128 / 32 x 34 bytes."""
    est = estimate(str(mtp_files["qwen35"]), ["-c", "4096", "-np", "1", "--spec-type", "draft-mtp"],
                   program=Program.SERVER)
    assert sum(d.context_bytes for d in est.companions[0].devices) == 4096 * 2 * 2 * 64 * 2 == 2 * MIB
    est = estimate(str(mtp_files["qwen35"]), ["-c", "4096", "-np", "1", "--spec-type", "draft-mtp", "-ctkd", "q8_0",
                                              "-ctvd", "q8_0"], program=Program.SERVER)
    assert sum(d.context_bytes for d in est.companions[0].devices) == 4096 * 2 * 128 // 32 * 34


def test_file_without_mtp_block_is_refused(llama_tools, shapes_dir, tmp_path):
    """llama.cpp makes no MTP context for a file without nextn blocks and llama-server stops; so does fitplan."""
    path = shapes_dir / "qwen35-no-mtp.gguf"
    if not path.exists():
        spec = qwen35_spec(moe=False, n_mtp=0, n_vocab=2048)
        add_tokenizer(spec, 2048, n_merges=1)
        spec.metadata[Keys.Tokenizer.PRE] = "default"
        spec.write(path)
    argv = ["-c", "4096", "-np", "1", "--spec-type", "draft-mtp"]
    with pytest.raises(ToolsError):
        _serve(llama_tools, path, argv, tmp_path / "server.log")
    assert "failed to create MTP context" in (tmp_path / "server.log").read_text(errors="replace")
    with pytest.raises(FlagError, match="no next-token-prediction block"):
        estimate(str(path), argv, program=Program.SERVER)


# Published widths, a short trunk: Qwen3.5-27B's and Qwen3.5-35B-A3B's layers (shapes_hybrid.py) and vocabulary,
# four trunk blocks (the fourth gated attention) and the MTP block; GLM-4.5-Air-like (glm4moe_factory.py), one
# dense and two MoE blocks and the MTP block. Sparse files; -nr keeps the host weights mapped, --no-warmup
# computes nothing (the buffers are the reserves').
def _qwen35_wide(moe: bool) -> ModelSpec:
    dims = (dict(n_embd=2048, n_head=16, n_head_kv=2, n_expert=256, n_expert_used=8, n_ff_exp=512, n_ff_shexp=512,
                 n_ff=512, n_v_heads=32, exp_type=Q.Q4_K, exp_down_type=Q.Q6_K) if moe
            else dict(n_embd=5120, n_head=24, n_head_kv=4, n_ff=17408, n_v_heads=48, ssm_out_type=Q.Q4_K))
    spec = qwen35_spec(moe=moe, n_mtp=1, n_layer=4, head_dim=256, n_rot=64, sections=QWEN35_SECTIONS, d_conv=4,
                       d_state=128, n_k_heads=16, n_vocab=QWEN35_VOCAB, n_ctx=QWEN35_CTX, mat_type=Q.Q4_K,
                       qkv_type=Q.Q6_K, ffn_type=Q.Q4_K, down_type=Q.Q6_K, embd_type=Q.Q4_K, out_type=Q.Q6_K, **dims)
    return tokenized(spec, QWEN35_VOCAB, QWEN35_CTX)


WIDE = {
    "qwen35-27b-wide": (lambda: _qwen35_wide(False), ("-c 32768", "{rpc} -c 32768 -ts 1,1")),
    "qwen35moe-35b-a3b-wide": (lambda: _qwen35_wide(True), ("-c 32768 -np 2 -ctkd q8_0 -ctvd q8_0",)),
    "glm45-air-like": (lambda: glm45_air_like(n_layer=3), ("{rpc} -c 32768 -ts 1,1",
                                                           "{rpc} -c 32768 -ts 1,1 -ngl 3 -fa off")),
    "deepseek-v3-like": (lambda: _deepseek_v3_like(), ("{rpc} -c 32768 -ts 1,1",)),
    "glm-5-like": (lambda: _glm_5_like(), ("{rpc} -c 32768 -ts 1,1",)),
}


def _deepseek_v3_like() -> ModelSpec:
    """DeepSeek-V3's attention and vocabulary (7168 wide, 128 heads, q_lora 1536, kv_lora 512, head 128 nope +
    64 rope, v 128, 129280 tokens) with one dense block, one MoE block of 16 experts and the MTP block."""
    spec = deepseek2_spec(n_layer=3, n_dense_lead=1, n_embd=7168, n_head=128, q_lora_rank=1536, kv_lora_rank=512,
                          qk_nope=128, qk_rope=64, v_head_dim=128, n_ff=18432, n_expert=16, n_expert_used=8,
                          n_expert_shared=1, n_ff_exp=2048, n_vocab=129280)
    return tokenized(_with_nextn(spec, 2), 129280, 163840)


def _glm_5_like() -> ModelSpec:
    """GLM-5's attention, lightning indexer (32 heads of 128, top 2048, in every block) and 154880-token
    vocabulary (shapes_mla.py glm_5) with one dense block, one MoE block of 16 experts and the MTP block."""
    spec = deepseek2_spec(n_layer=3, n_dense_lead=1, n_embd=6144, n_head=64, q_lora_rank=2048, kv_lora_rank=512,
                          qk_nope=128, qk_rope=64, v_head_dim=256, n_ff=12288, n_expert=16, n_expert_used=8,
                          n_expert_shared=1, n_ff_exp=2048, n_vocab=154880)
    spec = dsa_layout(_with_nextn(spec, 2), "glm-dsa", n_index_head=32, index_head=128, top_k=2048)
    return tokenized(spec, 154880, 202752)


@pytest.mark.parametrize("name, flags", [(n, f) for n, (_, fs) in WIDE.items() for f in fs])
def test_mtp_context_rows_at_published_widths(llama_tools, rpc_endpoints, shapes_dir, tmp_path, name, flags):
    path = shapes_dir / f"{name}.gguf"
    if not path.exists():
        WIDE[name][0]().write(path)
    _compare(llama_tools, rpc_endpoints, path, f"{flags} -nr --no-warmup", tmp_path)


def test_plan_with_mtp_loads_as_planned(llama_tools, rpc_endpoints, shapes_dir, tmp_path):
    """`plan --mtp` over the two rpc-servers with budgets that split the Qwen3.5-27B-wide file: llama-server,
    run with the plan's own arguments, loads the target and the MTP context with the plan's rows (every
    model's buffers added per device), each within its budget."""
    path = shapes_dir / "qwen35-27b-wide.gguf"
    if not path.exists():
        WIDE["qwen35-27b-wide"][0]().write(path)
    run = subprocess.run([sys.executable, "-m", "planner.cli", "plan", str(path), "--rpc", ",".join(rpc_endpoints),
                          "--max-vram", "RPC0=1.4,RPC1=1.6", "-c", "8192", "--mtp", "--format", "json"],
                         capture_output=True, text=True, timeout=600, check=True)
    doc = json.loads(run.stdout)
    argv = doc["argv"]
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp"
    assert [c["kind"] for c in doc["companions"]] == ["mtp"]
    planned = {d["name"]: d["total_bytes"] for d in doc["devices"]}   # every model's rows, as budgets judge them
    text = _serve(llama_tools, path, argv[argv.index("-m") + 2:], tmp_path / "server.log")
    loads = parse_model_loads(text)
    assert len(loads) == 2
    names = {f"RPC{i}": ep for i, ep in enumerate(rpc_endpoints)}
    loaded: dict[str, int] = {}
    for load in loads:
        for row, kinds in rows_by_device(load, names).items():
            loaded[row] = loaded.get(row, 0) + sum(kinds.values())
    assert set(loaded) == {row for row, size in planned.items() if size}
    for row, size in loaded.items():
        assert abs(size - planned[row]) <= 3 * LOG_ROUNDING, (row, size / MIB, planned[row] / MIB)
    for d in doc["devices"]:
        assert d["total_bytes"] <= d["budget_bytes"], d
