"""gemma2 and gpt-oss builders, and the shape-faithful models the estimate peer matrix adds.

Expected values come from the architectures' definitions in the pinned llama.cpp (src/models/
gemma2.cpp, openai-moe.cpp, llama-hparams.h defaults), worked out here by hand.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from planner.gguf.reader import read_model
from planner.llama.context import model_context
from planner.memory.estimate import estimate
from planner.synth.shapes_common import write_shape
from runtime.engine.hparams import read_hparams

NEW_SHAPES = ("mistral-7b", "qwen2-7b", "qwen3-8b", "gemma2-9b", "gpt-oss-20b")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("shapes")
    return {name: write_shape(name, d) for name in NEW_SHAPES}


@pytest.mark.parametrize("name", NEW_SHAPES)
def test_compute_is_simulated(name: str, shapes: dict[str, Path]) -> None:
    est = estimate(model_context(str(shapes[name])), ["-c", "4096"])
    assert est.compute_model == "simulated"


def test_gemma2_hparams(shapes: dict[str, Path]) -> None:
    """9B: Q pre-scaled by 1/sqrt(head_dim 256), attention scale 1, soft-caps 50 and 30, SWA on even
    layers with a 4096 window, the SWA rope base the base's (gemma2 copies rope_freq_base_train)."""
    hp = read_hparams(read_model(str(shapes["gemma2-9b"])))
    assert (hp.q_scale, hp.kq_scale) == (1 / 16, 1.0)
    assert (hp.attn_softcap, hp.softcap) == (50.0, 30.0)
    assert hp.swa == tuple(il % 2 == 0 for il in range(42)) and hp.n_swa == 4096
    assert hp.freq_base_swa == hp.freq_base


def test_gptoss_hparams(shapes: dict[str, Path]) -> None:
    """20B: 64 heads of 64, attention scale 1/8, YaRN x32 (freq_scale 1/32 on every layer, SWA ones
    included), SWA on even layers with a 128 window, 32 experts with 4 used."""
    hp = read_hparams(read_model(str(shapes["gpt-oss-20b"])))
    assert (hp.n_head, hp.head_dim, hp.kq_scale, hp.q_scale) == (64, 64, 1 / math.sqrt(64), 1.0)
    assert (hp.freq_scale, hp.freq_scale_swa, hp.ext_factor, hp.n_ctx_orig) == (1 / 32, 1 / 32, 1.0, 4096)
    assert (hp.freq_base, hp.freq_base_swa) == (150000.0, 150000.0)
    assert hp.swa == tuple(il % 2 == 0 for il in range(24)) and hp.n_swa == 128
    assert (hp.n_expert, hp.n_expert_used, hp.softcap, hp.attn_softcap) == (32, 4, 0.0, 0.0)
