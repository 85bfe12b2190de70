"""runtime/engine/clip_families.py: every projector type clip_hparams.SUPPORTED lists for projb's modules
has a family (reader, tensors, builder), and no family is left out of SUPPORTED (the coverage table)."""
from __future__ import annotations

from planner.gguf.pin_lists import pin_projectors
from runtime.engine.clip_families import PROJB_FAMILIES
from runtime.engine.clip_hparams import PROJB_SUPPORTED, SUPPORTED


def test_supported_types_have_families():
    assert {str(p) for p in PROJB_SUPPORTED} == set(PROJB_FAMILIES)
    assert set(PROJB_FAMILIES) <= {str(p) for p in SUPPORTED} and set(PROJB_FAMILIES) <= set(pin_projectors())
