"""The runner in bounded memory (issue #22): weights read from a map of the file, a dequant cache
of any size, the same logits bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from planner.llama.flags import parse_llama_flags
from planner.registry.examples import resolve_model
from runtime.engine.runner import ModelRunner
from runtime.ggml import dequant
from runtime.ggml.mapped import MappedBuffer

PROMPT = [2] + [(1000 + 7919 * i) % 262144 for i in range(8)]


@pytest.fixture
def restore_cache():
    yield
    dequant.cache().clear()
    dequant.set_capacity(None)


def _logits(capacity: int | None) -> tuple[np.ndarray, np.ndarray, ModelRunner]:
    dequant.cache().clear()
    dequant.set_capacity(capacity)
    runner = ModelRunner.load(resolve_model("example:gemma3-270m"), parse_llama_flags(["-c", "256"]))
    runner.dequantize_weights()
    prompt = runner.decode(PROMPT, all_logits=True)
    return prompt, runner.decode([int(prompt[-1].argmax())]), runner


def test_no_cache_gives_the_cached_logits_bit_for_bit(restore_cache):
    cached_prompt, cached_token, runner = _logits(None)
    assert dequant.cache().used > 0
    assert all(isinstance(t.buffer, MappedBuffer) for t in runner.weights.values())   # nothing copied
    banded_prompt, banded_token, _ = _logits(0)
    assert dequant.cache().used == 0
    np.testing.assert_array_equal(banded_prompt.view(np.uint32), cached_prompt.view(np.uint32))
    np.testing.assert_array_equal(banded_token.view(np.uint32), cached_token.view(np.uint32))
