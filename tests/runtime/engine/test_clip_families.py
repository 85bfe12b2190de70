"""runtime/engine/clip_families.py: the one table of projector families. clip_hparams.SUPPORTED (the coverage
table's list) is the SigLIP-tower heads plus exactly the table's types, each a type the pinned clip.cpp names;
every row's builder makes a graph from its own reader's figures."""
from __future__ import annotations

from planner.gguf.pin_lists import pin_projectors
from runtime.engine.clip_families import FAMILIES
from runtime.engine.clip_hparams import HEADS, SUPPORTED


def test_supported_is_heads_and_families():
    supported = [str(p) for p in SUPPORTED]
    assert len(supported) == len(set(supported))
    assert set(supported) == {str(p) for p in HEADS} | set(FAMILIES)
    assert not set(HEADS) & set(FAMILIES)
    assert set(supported) <= set(pin_projectors())
