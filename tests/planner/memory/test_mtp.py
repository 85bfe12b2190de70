"""draft-mtp's context and the target beside it (planner/memory/mtp.py), on small synthesized files.

Expected figures are worked out here from the definitions (llama-model.cpp create_memory with
LLAMA_CONTEXT_TYPE_MTP, llama-memory-recurrent.cpp's rows, common.h need_n_rs_seq); the peer test
(tests/peer/test_mtp_peer.py) compares the same rows with llama-server's.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from gguf import Keys

from planner.core.errors import FlagError
from planner.llama.flags import parse_llama_flags
from planner.llama.programs import Program, effective_program
from planner.memory.estimate import estimate
from planner.synth.gguf_factory import add_tokenizer
from planner.synth.qwen3next_factory import qwen35_spec

MIB = 2**20
N_HEAD_KV, HEAD = 2, 64
# qwen35_spec's defaults: the delta-net layers' conv state (d_conv - 1) x (2 x 2 x 32 + 4 x 32) and SSM
# state 32 x 32 x 4 heads, f32
STATE_R, STATE_S = 3 * (2 * 2 * 32 + 4 * 32), 32 * 32 * 4
N_DELTA_NET = 3


def _write(path: Path, n_mtp: int) -> str:
    spec = qwen35_spec(moe=False, n_mtp=n_mtp, n_vocab=2048)
    add_tokenizer(spec, 2048, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "default"
    spec.write(path)
    return str(path)


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _write(tmp_path_factory.mktemp("mtp") / "qwen35-mtp.gguf", 1)


def _server(path: str, *flags: str):
    return estimate(path, ["-c", "4096", "-np", "1", "--spec-type", "draft-mtp", *flags], program=Program.SERVER)


def test_draft_mtp_is_llama_servers_figure():
    flags = parse_llama_flags(["--spec-type", "draft-mtp"])
    assert flags.spec.mtp_context and flags.has_companions
    assert effective_program(Program.FIT_PARAMS, flags) is Program.SERVER
    assert not parse_llama_flags(["--spec-type", "draft-mtp", "-md", "d.gguf"]).spec.mtp_context


def test_the_mtp_cache_holds_the_nextn_block_alone(qwen35):
    """4096 cells x (K, V) x 2 KV heads x 64, f16: 2 MiB on the host; q8_0 (-ctkd/-ctvd) 34 bytes per 32."""
    (mtp,) = _server(qwen35).companions
    assert mtp.kind == "mtp" and sum(d.model_bytes for d in mtp.devices) == 0
    assert sum(d.context_bytes for d in mtp.devices) == 4096 * 2 * N_HEAD_KV * HEAD * 2 == 2 * MIB
    (q8,) = _server(qwen35, "-ctkd", "q8_0", "-ctvd", "q8_0").companions
    assert sum(d.context_bytes for d in q8.devices) == 4096 * 2 * N_HEAD_KV * HEAD // 32 * 34
    assert sum(d.compute_bytes for d in mtp.devices) > 0


def test_the_mtp_cache_follows_the_target_context_and_sequences(qwen35):
    """-np 2 -c 8192: two streams of 4096 cells, as the target's full-attention layer has."""
    (mtp,) = _server(qwen35, "-c", "8192", "-np", "2").companions
    assert sum(d.context_bytes for d in mtp.devices) == 8192 * 2 * N_HEAD_KV * HEAD * 2


def test_the_target_keeps_rollback_rows(qwen35):
    """n_rs_seq = --spec-draft-n-max (3): each recurrent state keeps 1 + 3 rows per sequence, beside the
    target's 4096-cell cache of its one attention layer."""
    plain = estimate(qwen35, ["-c", "4096", "-np", "1"], program=Program.SERVER)
    kv = 4096 * 2 * N_HEAD_KV * HEAD * 2
    states = N_DELTA_NET * (STATE_R + STATE_S) * 4
    assert sum(d.context_bytes for d in plain.devices) == kv + states
    for n_max in (3, 6):
        est = _server(qwen35, "--spec-draft-n-max", str(n_max))
        assert sum(d.context_bytes for d in est.devices) == kv + states * (1 + n_max)


def test_a_file_without_mtp_blocks_is_refused(tmp_path):
    path = _write(tmp_path / "qwen35.gguf", 0)
    with pytest.raises(FlagError, match="no next-token-prediction block"):
        _server(path)
