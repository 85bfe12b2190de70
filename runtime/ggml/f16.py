"""f16 arithmetic without numpy's slow f16 conversions: reading f16 through a table of all
65536 values, and rounding float32 values to their nearest f16 in float32 arithmetic."""
from __future__ import annotations

import numpy as np

# Every f16 bit pattern's f32 value: a gather from this 256 KiB table converts an f16 array
# (the KV cache, read by attention every step) in about half the time astype takes in numpy.
_F16_TO_F32: list[np.ndarray] = []


def f16_to_f32(values: np.ndarray) -> np.ndarray:
    if not _F16_TO_F32:
        _F16_TO_F32.append(np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32))
    return _F16_TO_F32[0].take(values.view(np.uint16))


# Rounding an f32 to the nearest f16 (ties to even) without a dtype conversion, which costs
# ~2 ns an element in numpy: adding M = 1.5 * 2^(E + 13), E = max(exponent of x, -14), leaves
# f32 steps of 2^(E - 10), f16's step at that exponent (2^-24 for its subnormals), and the
# f32 addition rounds to nearest even; subtracting M again is exact. Checked against astype
# for every f32 of magnitude <= 65504 (F16_MAX); larger values would need f16's overflow to inf.
# (0-d arrays: a numpy scalar operand costs a conversion on every call)
_F32_EXP_BITS = np.array(0x7F800000, dtype=np.uint32)
_F16_MIN_NORMAL_BITS = np.array(0x38800000, dtype=np.uint32)    # 2^-14 as f32 bits
_MAGIC_ADD_BITS = np.array((13 << 23) + (1 << 22), dtype=np.uint32)   # exponent + 13, mantissa 1.5
F16_MAX = 65504.0


class F16Grid:
    """Rounds one f32 array in place to the f32 values of its nearest f16s (sign of zero
    included, by copysign), |values| <= F16_MAX; scratch and views made once per array."""

    def __init__(self, x: np.ndarray) -> None:
        self.x, self.x_bits = x, x.view(np.uint32)
        self.m_bits = np.empty(x.shape, dtype=np.uint32)
        self.m, self.tmp = self.m_bits.view(np.float32), np.empty_like(x)

    def round(self) -> None:
        self.add_and_round(None)

    def add_and_round(self, term: np.ndarray | None) -> None:
        """x = f16(x + term) (term None: x = f16(x)); one call per cell in the hot loop."""
        x, m_bits, m, tmp = self.x, self.m_bits, self.m, self.tmp
        if term is not None:
            np.add(x, term, x)
        np.bitwise_and(self.x_bits, _F32_EXP_BITS, m_bits)
        np.maximum(m_bits, _F16_MIN_NORMAL_BITS, out=m_bits)
        np.add(m_bits, _MAGIC_ADD_BITS, m_bits)
        np.add(x, m, tmp)
        np.subtract(tmp, m, tmp)
        np.copysign(tmp, x, x)
