"""The graph builders' shape rules, as ggml states them (ggml/src/ggml.c at the pinned build)."""
from __future__ import annotations

import pytest

from runtime.ggml import build as gb
from runtime.ggml.graph import GGMLType


def _t(*ne: int) -> gb.Tensor:
    return gb.new_tensor(GGMLType.F32, ne)


@pytest.mark.parametrize("a, b, ok", [
    ((8, 4, 1, 1), (8, 1, 1, 1), True),      # a row broadcast over rows
    ((8, 4, 1, 1), (3, 1, 1, 1), False),     # 8 is not a multiple of 3
    ((8, 0, 1, 1), (8, 1, 1, 1), True),      # 0 is a multiple of 1: a non-empty b repeats into an empty a
    ((8, 4, 1, 1), (8, 0, 1, 1), False),     # ggml_can_repeat: an empty b repeats only into an empty a
    ((8, 0, 1, 1), (8, 0, 1, 1), True),
])
def test_can_repeat_is_ggml_can_repeat(a, b, ok):
    if ok:
        assert gb.add(_t(*a), _t(*b)).ne == a
    else:
        with pytest.raises(ValueError, match="does not broadcast"):
            gb.mul(_t(*a), _t(*b))
